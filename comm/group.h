// A group of ranks that run collectives together (MPI's communicator, Gloo's context).
//
// Contract:
// - Every rank of a group issues the same collectives in the same order (any thread, but one
//   issuing thread at a time per group). The sequence number of each collective is assigned in
//   that order and travels in every frame, so a rank that diverges is caught (MismatchError on
//   every rank) instead of mixing data.
// - Each group has its own sequence counter and executor, and its engine its own connections:
//   sub-groups made by split() never interfere with their parent.
// - Every operation has a deadline: the per-call timeout, else the group's (default 60 s,
//   SHOAL_TIMEOUT). A failure report adds at most about 1 s to it, whatever happened to the
//   store's host.
// - Any failure inside an operation (timeout, a peer's death or abort, mismatch, a bad frame, and
//   also store, system, parse or internal errors) aborts the group: every peer is told why and
//   which rank failed first (Error::origin(); messages say "(cause: rank k)"), and every later
//   call throws at once. Timeouts, peer failures, mismatches and bad frames reach the caller as
//   TimeoutError / PeerError / MismatchError / ProtocolError with that context; any other error
//   reaches the caller as it was thrown. Make a new group to go on. Argument errors found
//   before anything moved (InvalidArgument) fail that call alone.
// - Group is that contract only: ordering, sequence numbers, deadlines and the failure policy.
//   What moves the data is its engine (comm/engine.h): the native one (made by create() with a
//   store; comm/native/native_engine.h has what only it offers) or an external library's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/engine.h"
#include "comm/executor.h"
#include "comm/work.h"
#include "common/env.h"
#include "common/trace.h"
#include "common/types.h"
#include "store/store.h"

namespace shoal {
class FlightRecorder;  // common/flight_recorder.h
struct FlightOp;
}  // namespace shoal

namespace shoal::comm {

struct GroupOptions {
  Duration timeout = std::chrono::seconds(60);
  TransportKind transport = TransportKind::kAuto;
  // SHOAL_ENCRYPT: TLS on TCP links (common/encryption.h). auto: links to peers on other hosts.
  EncryptMode encrypt = EncryptMode::kAuto;
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  std::string listenAddress = "127.0.0.1";
  size_t shmRingBytes = 4u << 20;
  std::optional<std::string> secret;
  std::optional<std::string> secretFile;
  // Which incarnation of the world group this is: its store keys, its group id and so every
  // frame belong to it, so a job can destroy and re-create its world (and sub-groups) on the
  // same store, and a frame or record of an older generation is never taken for a newer one.
  // Unset: the number of worlds this rank created on this store before (every rank creates
  // its worlds in the same order, so they agree). Elastic jobs set it from the membership view.
  std::optional<uint64_t> generation;
  // Which host this rank is on, for the links (shared memory only between ranks of one host)
  // and the hierarchical all-reduce. Unset: the machine's identity (hostname and boot id).
  // Tests and emulations set it to make one machine look like several hosts; ranks that share
  // a label must really share a machine.
  std::optional<std::string> hostLabel;
  // The timeline (common/trace.h; SHOAL_TRACE makes one): when set, the group and every group
  // split or connected from it record a span per operation into it. Note [Operation spans] in
  // group.cpp says what a span holds. Null: nothing is recorded (one branch per operation).
  std::shared_ptr<TraceSink> trace;
  // The flight recorder (common/flight_recorder.h; SHOAL_FLIGHT_DIR makes one): when set, the
  // group and every group split or connected from it note each operation in issue order when
  // it starts and when it ends, in a file that outlives the process. Null: nothing is noted.
  std::shared_ptr<FlightRecorder> flight;

  // The SHOAL_* environment (see common/env.h), validated.
  static GroupOptions fromEnv();
  static GroupOptions from(const EnvConfig& env);
};

// Per-call overrides.
struct CallOptions {
  std::optional<Duration> timeout;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;  // kAuto: the group's choice
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Collective over `size` ranks sharing `store`, on the native engine (unscoped: the group
  // scopes its keys under its generation, see GroupOptions::generation). Blocks until every
  // rank joined and all connections are authenticated, or the timeout.
  static std::shared_ptr<Group> create(std::shared_ptr<store::Store> store, int rank, int size,
                                       GroupOptions options = GroupOptions::fromEnv());
  // A group whose operations run on `engine` (an external library: comm/mpi/mpi_engine.h);
  // rank and size are the engine's.
  static std::shared_ptr<Group> create(std::shared_ptr<Engine> engine,
                                       GroupOptions options = GroupOptions::fromEnv());

  ~Group();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const GroupOptions& options() const { return options_; }
  // The world generation this group (or the world it was split from) belongs to.
  uint64_t generation() const { return engine_->generation(); }
  // "native", or the library's name ("mpi").
  std::string_view engineName() const { return engine_->name(); }
  Engine& engine() const { return *engine_; }
  // The same on every member, different for every group of a job's generation: "world", a
  // split's "<parent>/split<n>.<color>" (its parent's n-th split), a connected group's name.
  // The flight recorder keys its entries by it.
  const std::string& label() const { return label_; }
  // Bytes this rank has sent in this group's operations so far (comm/engine.h's bytesSent):
  // what a step's communication really cost, compression included. Thread-safe.
  uint64_t bytesSent() const { return engine_->bytesSent(); }

  // Collective (like MPI_Comm_split): ranks with the same color form a new group, ordered by
  // key then by rank in this group. A negative color joins no group and gets nullptr.
  std::shared_ptr<Group> split(int color, int key);

  // Not collective: a new group of `size` ranks named `name`, joined only by its members (each
  // passes its rank in the new group). Shares this group's store and secret; blocks until all
  // members connected, bounded by `timeout` (default: the group timeout). Each name must be
  // used once per job. Parameter servers use one per (server, worker) pair. Native engine only
  // (InvalidArgument otherwise).
  std::shared_ptr<Group> connect(const std::string& name, int rank, int size,
                                 std::optional<Duration> timeout = std::nullopt);

  // Thread-safe, for another thread than the one running an operation: makes the running and
  // every later operation fail with PeerError, and the peers see this rank leave. Native engine
  // only (a no-op on MPI).
  void interrupt() noexcept { engine_->interrupt(); }

  // Runs `op` on the engine in issue order (see the class comment): synchronously (returns
  // null; throws what failed) or queued (`async`: its Work carries what failed). Used by the
  // entry points of comm/collectives.h.
  std::shared_ptr<Work> run(const Operation& op, const CallOptions& call, bool async);

  // Point-to-point: the engine's own channels, or `op` run in issue order where the engine has
  // none (comm/engine.h's Engine::post).
  std::shared_ptr<Work> post(const Operation& op, const CallOptions& call);
  // A blocking send or receive: the engine's direct path where it has one (Engine::transferNow;
  // not while tracing, which records every message's span through its Work), else post() and a
  // wait.
  void transfer(const Operation& op, const CallOptions& call);

  // Runs `task` as an operation of kind `op` in issue order, under the failure policy: what it
  // throws fails the group (the engine's abort() tells the peers). `seq` is its sequence number
  // (0 for op::kSendRecv, which is not numbered). For operations an engine offers beyond the
  // collectives (comm/native/native_engine.h's execute()).
  using Task = std::function<void(uint64_t seq, const Deadline& deadline)>;
  std::shared_ptr<Work> runTask(transport::OpCode op, bool async, const CallOptions& call,
                                Task task);

 private:
  Group(std::shared_ptr<Engine> engine, GroupOptions options);
  // `described`: the operation as the entry points gave it, for its span (null for tasks).
  // `issuedNs`: when an asynchronous operation was queued (trace clock; 0 when not tracing).
  std::shared_ptr<Work> schedule(transport::OpCode op, bool async, const CallOptions& call,
                                 Task task, std::optional<Operation> described);
  void runOrdered(transport::OpCode op, const CallOptions& call, const Task& task,
                  const Operation* described, int64_t issuedNs);
  // What the flight recorder notes about an operation.
  FlightOp flightOp(transport::OpCode op, uint64_t seq, const Operation* described) const;
  // Records a span for point-to-point `work`, posted at `postedNs`, once it completes.
  void traceMessage(Work& work, const Operation& op, int64_t postedNs);
  // Runs `task` in issue order on the caller's thread (or waits for the executor to run it).
  void inOrder(const std::function<void()>& task);
  // Queues `task` in issue order; its Work carries what it threw.
  std::shared_ptr<Work> queue(std::function<void()> task);
  // Creates the group with `label` (see label()).
  static std::shared_ptr<Group> create(std::shared_ptr<Engine> engine, GroupOptions options,
                                       std::string label);

  std::shared_ptr<Engine> engine_;
  int rank_;
  int size_;
  GroupOptions options_;
  uint64_t nextSeq_ = 0;
  std::string label_ = "world";
  uint64_t splits_ = 0;  // split() calls so far: part of each sub-group's label
  // The first failure (what its caller got), once an operation failed; later calls are refused
  // with it. Written and read by the thread running operations only.
  std::exception_ptr failure_;
  // Last: destroyed first, it drains what is queued while the engine still exists.
  Executor executor_;
};

}  // namespace shoal::comm
