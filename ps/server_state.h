// Internal: one copy of one shard served to every worker (the primary, or a backup: Note
// [Replicated shards] in ps/server.h), its state and the members that act on it. serve()
// (ps/server.cpp) runs one, or two with replicas 2. The members are defined by what they do:
// - ps/server.cpp: construction, run() (restore, one thread per worker, the final checkpoint);
// - ps/server_session.cpp: a worker's thread, each request's exchange with it, failure;
// - ps/server_requests.cpp: the requests (hello, init, push, pull, bye) under the lock, and the
//   decoding of compressed pushes;
// - ps/server_stream.cpp: push-pulls answered while applied (Note [Streamed push-pull]);
// - ps/server_waits.cpp: holds on the shard, the bounded waits, the workers' clocks and the
//   shard's versions;
// - ps/server_handover.cpp: Note [Replacement servers] (ps/replacement.h): a surviving copy
//   handing the shard over to a replacement, and a replacement taking it;
// - ps/server_request_checks.cpp: whether a request may (what it covers: ps/request_target.h);
// - ps/server_checkpoint.cpp: checkpoints written, and the one restored.
//
// Threading: one thread per worker runs serveWorker(); mu_ guards every field declared after
// it, and cv_ is notified after each change a waiter may be waiting for. Each member below says
// whether it takes mu_ itself ("locks") or must be called with it held ("under mu_"). The
// partition and the shard objects are set once (restore() before the threads start, or the
// first hello) and never replaced; a pushed update is applied to the shard's values outside
// mu_ under a write hold, a pull reply sent from them under a read hold (Note [Shard access] in
// ps/shard_access.h).
// Blocking: the waits for other workers are bounded by the world group's timeout (waitUntil);
// a worker's next request by ServerOptions::idleTimeout. A failure anywhere ends every wait
// (PeerError with failure_).
// Errors: a request is refused to its worker (InvalidArgument: the reply says why); a worker
// that fails or breaks the protocol, or a ServerFault, stops the server (fail()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/group.h"
#include "comm/native/op_context.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/protocol.h"
#include "ps/request_target.h"
#include "ps/server.h"
#include "ps/shard.h"
#include "ps/shard_access.h"
#include "ps/trace_spans.h"

namespace shoal::ps::detail {

// A failure of the server itself, never of the worker it was serving when it happened.
class ServerFault : public Error {
 public:
  using Error::Error;
};

// A checkpoint the server could not write.
class CheckpointWriteError : public ServerFault {
 public:
  using ServerFault::ServerFault;
};

// Per worker thread buffers, reused from request to request.
struct Scratch {
  std::vector<transport::Transfer> batch;
  std::string text;
  std::vector<uint8_t> drain;
  // What this request holds of the shard (Note [Shard access] in ps/shard_access.h).
  bool writing = false;  // a push applied as it arrives, planned in `incoming`
  bool reading = false;  // a pull reply sent straight from the values
  Shard* shard = nullptr;
  Shard::Incoming incoming;
  // Note [Streamed push-pull]: the reply, decided before the push is applied, and its values
  // going out as they are updated (`ready` bytes of them so far).
  bool streaming = false;
  Reply reply;
  const float* values = nullptr;
  size_t ready = 0;
  // A compressed push (ps/payload_codec.h): what it covers, its payload and its float32
  // decoding; an fp16 pull's values.
  Target target;
  std::vector<uint8_t> packed;
  std::vector<float> decoded;
  std::vector<uint16_t> half;
  // The span of an update applied as it arrives (ps/trace_spans.h), from its first byte on.
  std::optional<TraceSpan> apply;
};

// The receive-apply kernel (transport::PieceHandler; context: the worker's Scratch): a piece
// of a push, straight from the receive ring, applied to the shard. A streamed reply may then
// send the values of this piece (the payload and the values cover the same elements).
// Outside mu_, under the write hold of sc.incoming's push.
void applyPiece(void* context, const void* data, size_t offset, size_t bytes);

class Server {
 public:
  // `backup`: this is the backup of shard `id`, hosted by server (id + 1) % servers (Note
  // [Replicated shards] in ps/server.h): its own connections, no checkpoints.
  Server(comm::Group& world, int id, int servers, int workers, const ServerOptions& o,
         bool backup = false);
  // Waits for a handover still being sent (Note [Replacement servers]).
  ~Server();

  // Serves every worker until each said goodbye or one failed; blocking. Throws PeerError with
  // the failure that stopped the server, or what restoring or writing the final checkpoint
  // threw.
  ServerReport run();

 private:
  // ---- one thread per worker (ps/server_session.cpp)

  // A worker's thread: connects to it, then handles its requests until its goodbye. Never
  // throws: a failure stops the server (fail()).
  void serveWorker(int w);
  // One request's exchange: receives it, its payload, then replies. Returns whether it was the
  // worker's goodbye. Throws what ends the worker's thread (the worker's stream failed or broke
  // the protocol; a ServerFault); a refused request is answered, not thrown.
  bool handle(comm::OpContext& ctx, int w, Scratch& sc);
  // Locks.
  void setBusy(int w, bool busy);
  // Locks. The first failure stops the server: it wakes every waiter and closes the idle
  // connections; later ones are dropped.
  void fail(int w, const std::string& what, bool serverFault = false);

  // ---- the requests (ps/server_requests.cpp)

  // Where the request's payload goes (null: it has none, or the request is refused and the
  // payload is drained). Throws to refuse. Locks; may wait (bounded).
  void* prepare(int w, const Request& rq, Scratch& sc);
  // Once the payload is in: the request's effect, and the reply (its values `out`, outBytes of
  // them, from the shard under a read hold). Throws to refuse. Locks; may wait (bounded).
  void complete(int w, const Request& rq, Scratch& sc, Reply& rp, const void*& out,
                size_t& outBytes);
  // Under mu_.
  void hello(int w, const std::string& text, Reply& rp);
  // Under mu_; may wait (bounded) for the write hold or a checkpoint.
  void push(std::unique_lock<std::mutex>& lock, int w, const Request& rq, Scratch& sc);
  // Records an update's span (ps/trace_spans.h), if begun; before the pusher's clock moves on.
  // Under mu_.
  void traceApply(std::optional<TraceSpan>& span, int w, const Request& rq, const Target& t,
                  bool fromSlots);
  // Under mu_; waits (bounded) for the step, the staleness bound and the read hold.
  void pull(std::unique_lock<std::mutex>& lock, int w, const Request& rq, uint64_t step,
            Scratch& sc, Reply& rp, const void*& out, size_t& outBytes);
  // A compressed push, received whole: decoded, then applied as it would have arrived (the
  // write hold taken in prepare()) or left in the worker's slot. A message the codec refuses
  // is refused before anything changed: the hold is given back untouched. Outside mu_ (locks
  // to give the hold back).
  void unpack(const Request& rq, Scratch& sc, float* slot);

  // ---- Note [Streamed push-pull] (ps/server_stream.cpp)

  // Under mu_, the write hold taken: decides whether the push-pull streams its reply.
  void maybeStream(int w, const Request& rq, const Target& t, Scratch& sc);
  // Locks. Once the streamed exchange is done: the push's effect. Throws PeerError if the
  // server failed meanwhile, ServerFault for what else went wrong (the worker already has its
  // reply).
  void completeStreamed(int w, const Request& rq, Scratch& sc);

  // ---- holds on the shard (Note [Shard access] in ps/shard_access.h; ps/server_waits.cpp)

  // Under mu_; waits (bounded).
  void beginWrite(std::unique_lock<std::mutex>& lock);
  // Under mu_.
  void endWrite(Scratch& sc);
  // Under mu_; waits (bounded).
  void beginRead(std::unique_lock<std::mutex>& lock, Scratch& sc);
  // Locks, if the request holds the values for reading.
  void endRead(Scratch& sc);

  // ---- request checks (ps/server_request_checks.cpp): under mu_; piecesOf() also outside it
  // once configured (it reads only the partition, never replaced).

  // Throws InvalidArgument for a request no piece of this shard answers.
  Target target(const Request& rq) const;
  static void expectBytes(uint64_t got, uint64_t expected, const char* what);
  std::span<const Piece> piecesOf(const Target& t) const;
  void requireConfigured() const;

  void throwIfFailed() const {
    if (!failure_.empty()) throw PeerError(failure_);
  }

  // ---- waiting (bounded by the world's timeout; a failure elsewhere ends every wait;
  // ps/server_waits.cpp; under mu_)

  template <typename Pred, typename What>
  void waitUntil(std::unique_lock<std::mutex>& lock, Pred pred, What what) {
    const auto timeout = world_.options().timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      throwIfFailed();
      if (pred()) return;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        throwIfFailed();
        if (pred()) return;
        SHOAL_THROW(TimeoutError, "{}: {} (waited {:.0f} s)", name_, what(),
                    std::chrono::duration<double>(timeout).count());
      }
    }
  }

  void waitInitialized(std::unique_lock<std::mutex>& lock);
  void waitForStep(std::unique_lock<std::mutex>& lock, int w, const Target& t, uint64_t step);
  uint64_t minVersion(const Target& t) const;
  std::string missing(const Target& t) const;
  // The slowest running worker's clock (steps pushed); finished workers do not hold others.
  // With `pusher`: as it will be once that worker's clock is at least `clock`.
  uint64_t minClock(int pusher = -1, uint64_t clock = 0) const;

  // ---- checkpoints (ps/server_checkpoint.cpp)

  // Under mu_.
  uint64_t checkpointRound() const;
  // Under mu_; may wait (bounded) for an update to finish, then writes.
  void maybeCheckpoint(std::unique_lock<std::mutex>& lock);
  // Under mu_ (or before the threads start); throws CheckpointWriteError.
  void writeCheckpoint(uint64_t round);
  // Before the threads start (collective over the servers).
  void restore();

  // ---- Note [Replacement servers] (ps/replacement.h; ps/server_handover.cpp)

  // The whole shard as a request target.
  Target wholeShard() const;
  // Under mu_, in synchronous mode, with the write hold of a push `rq` that completes step
  // rq.step of the whole shard `t`: if this copy is alone and a replacement of the other copy
  // waits (one store round trip), step rq.step + 1 becomes the handover.
  void maybePlanHandover(const Request& rq, const Target& t);
  // Under mu_, after an update: once the planned handover's step is reached, snapshots the
  // shard and starts sending it (handoverThread_).
  void maybeHandOver();
  // Under mu_: the flags of a pull reply for `step` (the replacement it announces, if any).
  uint64_t pullFlags(uint64_t step) const;
  // Before the threads start, on a replacement: takes this copy from the surviving one. False
  // if the job ended first. Throws what failed (the transfer, a snapshot that does not fit).
  bool takeOver();
  // After the threads ended without failure: waits for a handover being sent, then closes the
  // other copy's replacements (a waiting one is told the job ended). Never throws.
  void closeReplacements();
  // The pair group name for worker w (a replacement's own names carry its incarnation).
  std::string pairNameFor(int w) const;

  comm::Group& world_;
  const int id_, servers_, workers_;
  const ServerOptions opt_;
  const bool backup_;
  TraceSink* const sink_;   // the world's (ps/trace_spans.h); null: not tracing
  const std::string name_;  // in messages
  std::unique_ptr<SealedSeries> series_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool configured_ = false, initialized_ = false, restored_ = false;
  std::unique_ptr<Partition> partition_;
  TrainingConfig config_;
  std::string configText_;
  std::unique_ptr<Shard> shard_;
  uint64_t resumeStep_ = 0;
  uint64_t lastCheckpoint_ = 0;
  std::vector<uint64_t> clocks_;
  std::vector<char> done_;
  std::vector<char> busy_;
  std::vector<std::shared_ptr<comm::Group>> pairs_;
  ShardAccess access_;
  std::string failure_;
  ServerReport report_;
  // Note [Replacement servers]: a worker said it has no other copy of this shard.
  bool sole_ = false;
  // The handover planned or made last (step 0: none): pulls for `handoverStep_` or later
  // announce replacement `handoverIncarnation_`.
  uint64_t handoverStep_ = 0;
  int64_t handoverIncarnation_ = 0;
  bool handedOver_ = false;  // its snapshot was taken
  std::thread handoverThread_;
  // This copy's incarnation when it is a replacement (0: the original).
  int64_t incarnation_ = 0;
};

}  // namespace shoal::ps::detail
