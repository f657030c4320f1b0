// A worker's side of parameter-server training.
//
// Construction connects to every server (a two-rank group each, on shared memory or TCP) and
// sends the model's keys and the training settings; all workers must pass the same ones. On a
// fresh start worker 0 then calls initialize() with the initial values; on a resumed job
// startStep() says where training continues.
//
// Calls return a comm::Work handle: wait(timeout), test(), or onDone(callback). Buffers belong
// to the call until its Work finishes. Calls to one server run in issue order; different servers
// work in parallel. Timeouts: each exchange is bounded by the world group's timeout plus a
// margin (the servers bound their own waits by the timeout and say whom they waited for).
// Errors: InvalidArgument when a server refuses a request (the client stays usable);
// PeerError / TimeoutError naming the server otherwise (that server's connection is done).
//
// Compression (ClientOptions): pushes may travel compressed and pulls in fp16 (ps/payload_codec.h);
// the servers decode and then apply as for raw float32. traffic() counts the payload bytes.
//
// Tracing: with the world's trace sink (GroupOptions::trace, SHOAL_TRACE), each push, pull and
// push-pull records a span of category "ps" with its step, key, bytes, version and lead
// (ps/trace_spans.h); without one, each call pays a branch.
//
// Threading: one thread issues calls at a time; Work callbacks run on internal threads.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/compress/spec.h"
#include "comm/group.h"
#include "comm/work.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/protocol.h"

namespace shoal::ps {

class PushEncoder;
class ResidualCheckpoints;

// How this worker's data travels; workers of one job may choose differently.
struct ClientOptions {
  // Compression of pushed gradients (comm/compress/spec.h): none, fp16, bf16, topk:DENSITY or
  // onebit, ",warmup=N" sending the pushes of steps < N raw. Each push is encoded piece by piece
  // (Note [Payload layout] in ps/payload_codec.h); top-k and 1-bit keep an error-feedback
  // residual per element on this worker (residual()). State keys always travel as float32.
  // powersgd is DDP-only: the constructor throws InvalidArgument.
  compress::CompressionSpec compression;
  // Pulls receive the values as fp16 (half the bytes) and decode them to float32. This loses
  // precision in this worker's copy only: the servers' master values stay float32, and the
  // updates are applied to them.
  bool pullHalf = false;
  // Copies of each shard the servers keep: 1, or 2 (Note [Replicated shards] in ps/server.h;
  // every worker and server of the job must use the same value, shoal run --ps-replicas).
  // With 2, every push (and hello, init, goodbye) goes to the shard's primary and to its backup
  // and completes once both applied it; pulls go to the primary. When a server is lost (its
  // connection breaks or it stops answering within the timeout), its shard continues on the
  // backup: this worker says so once on stderr and counts it in failovers(). Losing both copies
  // of a shard fails the call with PeerError naming both servers. A lost copy comes back when
  // the job starts a replacement server (shoal run --ps-replacements): once a reply announces
  // it, this worker's next call on that shard first connects to the replacement and says hello
  // (blocking, bounded by the timeout; if that fails, one warning and the shard goes on with one
  // copy). Note [Replacement servers] in ps/replacement.h.
  int replicas = 1;
  // Where the servers write their checkpoints, how often and how many they keep (pass the
  // servers' ServerOptions values). With top-k or 1-bit compression this worker then saves its
  // error-feedback residuals there too (ps/residual_checkpoint.h: worker-<w>/), and a resumed
  // job reads those of startStep(), so that it continues as an uninterrupted one would (exactly,
  // in synchronous mode). Without that file (a checkpoint written without compression, or
  // deleted) the worker says so on stderr and starts from zero residuals. A damaged file fails
  // the constructor with InvalidArgument naming it. Empty: residuals are neither saved nor read.
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keep = 2;
};

// Payload bytes this worker sent and received (request and reply headers not counted), over
// the push and pull calls that completed.
struct Traffic {
  uint64_t pushes = 0;       // push and push-pull calls (whole model or one key)
  uint64_t pushedBytes = 0;  // their payloads, as encoded
  uint64_t pulls = 0;        // pull and push-pull calls
  uint64_t pulledBytes = 0;  // the values received, as encoded
};

class Client {
 public:
  Client(comm::Group& world, int worker, int numWorkers, int numServers, std::vector<KeySpec> keys,
         const TrainingConfig& config, const ClientOptions& options = {});
  // Says goodbye to the servers if finish() was not called (errors are swallowed here; call
  // finish() to see them). After a failed call (not a refusal) or while an exception unwinds,
  // it leaves instead (Group::interrupt on every link): the servers then fail the other
  // workers' waits at once, naming this worker, rather than holding a synchronous step for
  // its next push until the timeout.
  ~Client();

  const Partition& partition() const { return partition_; }
  int worker() const { return worker_; }
  // The step training starts at (0, or the step of the servers' checkpoint).
  int64_t startStep() const { return startStep_; }
  // True on worker 0 of a fresh job: it must call initialize() before anyone can pull.
  bool mustInitialize() const { return mustInitialize_; }
  // Blocking. `flat` holds every key's initial values end to end (partition order).
  void initialize(const float* flat);

  // Whole-model calls on flat buffers (every key end to end; gradients for parameter keys,
  // current values for state keys). pushPull pushes `step` and pulls the values for step + 1.
  std::shared_ptr<comm::Work> push(const float* flat, int64_t step);
  std::shared_ptr<comm::Work> pull(float* flat, int64_t step);
  std::shared_ptr<comm::Work> pushPull(const float* grads, float* values, int64_t step);

  // One key. The dtype and shape are the caller's: a server refuses ones that do not match the
  // key (InvalidArgument).
  std::shared_ptr<comm::Work> pushKey(const std::string& key, const void* data, DataType dtype,
                                      const std::vector<int64_t>& shape, int64_t step);
  std::shared_ptr<comm::Work> pullKey(const std::string& key, void* data, DataType dtype,
                                      const std::vector<int64_t>& shape, int64_t step);

  // Blocking goodbye to every server.
  void finish();

  // For each completed pull: how many steps this worker was ahead of the slowest worker when the
  // servers released it (the largest over the servers). SSP bounds it by the staleness.
  std::vector<int64_t> leads() const;
  // Totals so far (thread-safe).
  Traffic traffic() const;
  // Replicas this worker stopped using because their server was lost (replicas 2).
  uint64_t failovers() const;
  // What error feedback holds back, per element of the model in flat order (partition());
  // empty unless compressing with top-k or 1-bit. Changes with each push call.
  const std::vector<float>& residual() const;

  // The connection to server s (diagnostics and protocol tests); with replicas 2, to the
  // primary of shard s.
  comm::Group& link(int server);

 private:
  std::shared_ptr<comm::Work> whole(int kind, const float* payload, float* into, int64_t step);
  std::shared_ptr<comm::Work> keyed(int kind, const std::string& key, const void* payload,
                                    void* into, DataType dtype, const std::vector<int64_t>& shape,
                                    int64_t step);
  // The request's payload: `grad`, the elements of `pieces` (one server's), as this step's
  // encoding.
  void setPush(Exchange& x, std::span<const Piece> pieces, const float* grad, int64_t step);
  // Reads the residuals saved for startStep() (ClientOptions::checkpointDir).
  void restoreResiduals();
  // The request's values: `count` elements into `into`, raw or fp16.
  void setPull(Exchange& x, size_t count, float* into);
  // Runs exchange `x` on shard s's server, or its replicas (Note [Replicated shards]).
  std::shared_ptr<comm::Work> submit(int shard, std::shared_ptr<Exchange> x);
  // Finishes once every exchange did; counts the traffic (and the leads of a whole pull), and
  // records `span` (ps/trace_spans.h) if there is one.
  std::shared_ptr<comm::Work> allExchanges(int kind, std::vector<std::shared_ptr<Exchange>> xs,
                                           std::vector<std::shared_ptr<comm::Work>> works,
                                           bool leads, std::optional<TraceSpan> span);

  comm::Group& world_;
  int worker_;
  int numServers_;
  Partition partition_;
  std::chrono::nanoseconds timeout_;
  // The pair groups: server s's at s; with replicas 2, shard s's primary at 2s and its backup
  // at 2s + 1.
  std::vector<std::shared_ptr<comm::Group>> links_;
  int64_t startStep_ = 0;
  bool mustInitialize_ = false;
  bool finished_ = false;
  bool pullHalf_ = false;
  std::unique_ptr<PushEncoder> encoder_;  // null: raw pushes
  // With checkpointDir and error feedback (top-k, 1-bit).
  std::unique_ptr<ResidualCheckpoints> residuals_;
  struct Stats;
  std::shared_ptr<Stats> stats_;
  class Replicas;
  std::shared_ptr<Replicas> replicas_;  // null: one copy of each shard
};

}  // namespace shoal::ps
