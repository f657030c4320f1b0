// A group of ranks that run collectives together (MPI's communicator, Gloo's context).
//
// Contract:
// - Every rank of a group issues the same collectives in the same order (any thread, but one
//   issuing thread at a time per group). The sequence number of each collective is assigned in
//   that order and travels in every frame, so a rank that diverges is caught (MismatchError on
//   every rank) instead of mixing data.
// - Each group has its own connections, sequence counter and executor: sub-groups made by
//   split() never interfere with their parent.
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
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/diagnostics.h"
#include "comm/executor.h"
#include "comm/op_code.h"
#include "comm/p2p_channel.h"
#include "comm/work.h"
#include "common/env.h"
#include "common/types.h"
#include "store/store.h"
#include "transport/acceptor.h"
#include "transport/endpoint.h"

namespace shoal::comm {

enum class AllreduceAlgorithm : uint8_t {
  kAuto = 0,
  kRing = 1,
  kRecursiveDoubling = 2,  // plain recursive doubling: the whole buffer each round
  kDriver = 3,             // reduce to rank 0, then broadcast: the baseline
  kRabenseifner = 4,       // reduce-scatter by recursive halving + all-gather by doubling
};
std::string_view toString(AllreduceAlgorithm a);
AllreduceAlgorithm parseAllreduceAlgorithm(std::string_view name);

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
  transport::EndpointOptions endpoint;
  // Which incarnation of the world group this is: its store keys, its group id and so every
  // frame belong to it, so a job can destroy and re-create its world (and sub-groups) on the
  // same store, and a frame or record of an older generation is never taken for a newer one.
  // Unset: the number of worlds this rank created on this store before (every rank creates
  // its worlds in the same order, so they agree). Elastic jobs set it from the membership view.
  std::optional<uint64_t> generation;

  // The SHOAL_* environment (see common/env.h), validated.
  static GroupOptions fromEnv();
  static GroupOptions from(const EnvConfig& env);
};

// Per-call overrides.
struct CallOptions {
  std::optional<Duration> timeout;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;  // kAuto: the group's choice
};

class Group;

// What an algorithm sees while it runs: the frame template for this operation, the deadline,
// and helpers to move framed messages.
class OpContext {
 public:
  OpContext(Group& group, transport::FrameHeader base, Duration timeout);

  int rank() const;
  int size() const;
  const transport::FrameHeader& base() const { return base_; }
  void setAlgorithm(uint8_t algo) { base_.algo = algo; }
  const Deadline& deadline() const { return deadline_; }

  transport::FrameHeader header(uint32_t step, uint64_t bytes) const;

  // Runs a batch (see transport::Endpoint::run).
  void run(std::vector<transport::Transfer>& batch);

  // Builders for batch entries; `step` must be computed identically by sender and receiver.
  transport::Transfer send(int peer, uint32_t step, const void* data, size_t bytes) const;
  // Only the first *ready bytes may go so far (transport::Transfer::sendAsReady).
  transport::Transfer sendAsReady(int peer, uint32_t step, const void* data, size_t bytes,
                                  const size_t* ready) const;
  transport::Transfer recv(int peer, uint32_t step, void* data, size_t bytes) const;
  transport::Transfer recvReduce(int peer, uint32_t step, void* data, size_t bytes) const;
  // The receive-reduce after which the elements it covers hold their reduction over every
  // rank: for kAvg it also divides by size() in the same pass (Note [Average in the last
  // step] in comm/algorithms.h); for other ops it is recvReduce.
  transport::Transfer recvReduceFinal(int peer, uint32_t step, void* data, size_t bytes) const;
  // The payload goes to `handler` piece by piece as it arrives (transport::PieceHandler).
  transport::Transfer recvApply(int peer, uint32_t step, size_t bytes,
                                transport::PieceHandler handler) const;

  Group& group() { return group_; }

 private:
  Group& group_;
  transport::FrameHeader base_;
  Deadline deadline_;
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Collective over `size` ranks sharing `store` (unscoped: the group scopes its keys under its
  // generation, see GroupOptions::generation). Blocks until every rank published its record, or
  // the timeout. Connects nothing: a pair connects when one of them first needs the other
  // (transport/endpoint.h), through this rank's acceptor, which this world creates here and
  // shares with every group split or connected from it.
  static std::shared_ptr<Group> create(std::shared_ptr<store::Store> store, int rank, int size,
                                       GroupOptions options = GroupOptions::fromEnv());
  // A group whose operations run on an external library (see comm/backend.h); rank and size
  // are the backend's.
  static std::shared_ptr<Group> create(std::shared_ptr<Backend> backend,
                                       GroupOptions options = GroupOptions::fromEnv());

  ~Group();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const GroupOptions& options() const { return options_; }
  uint32_t id() const { return id_; }
  // The world generation this group (or the world it was split from) belongs to.
  uint64_t generation() const { return generation_; }
  // The native engine's link to `peer` (InvalidArgument on a backend group): the kind it has,
  // or will have once the pair first talks (planned at creation; links are made on first use).
  transport::LinkKind linkKind(int peer) const;
  // "native", or the backend's name ("mpi").
  std::string_view backendName() const { return backend_ ? backend_->name() : "native"; }
  Backend* backend() const { return backend_.get(); }
  // Every peer is (or will be, see linkKind) reached over shared memory (false for a group of
  // one).
  bool allLinksShm() const { return allShm_; }

  // Collective (like MPI_Comm_split): ranks with the same color form a new group, ordered by
  // key then by rank in this group. A negative color joins no group and gets nullptr.
  std::shared_ptr<Group> split(int color, int key);

  // Not collective: a new group of `size` ranks named `name`, joined only by its members (each
  // passes its rank in the new group). Shares this group's store and secret; blocks until all
  // members connected, bounded by the group timeout. Each name must be used once per job.
  // Parameter servers use one per (server, worker) pair. Native engine only.
  // `timeout` bounds the connection phase (default: the group timeout).
  std::shared_ptr<Group> connect(const std::string& name, int rank, int size,
                                 std::optional<Duration> timeout = std::nullopt);

  // Thread-safe, for another thread than the one running an operation: makes the running and
  // every later operation fail with PeerError, and the peers see this rank leave. Native engine
  // only (a no-op on a backend group).
  void interrupt() noexcept {
    if (endpoint_) endpoint_->interrupt();
  }

  // Runs `body` as operation `op` in issue order (see the class comment). Synchronous:
  // throws what the operation threw. Used by the collectives; not needed by applications.
  void execute(transport::OpCode op, const transport::FrameHeader& base, const CallOptions& call,
               std::function<void(OpContext&)> body);
  std::shared_ptr<Work> submit(transport::OpCode op, const transport::FrameHeader& base,
                               const CallOptions& call, std::function<void(OpContext&)> body);

  // The point-to-point channel to `peer` for `tag` (comm/p2p_channel.h), made on first use.
  // Thread-safe. Native engine only.
  P2pChannel& p2pChannel(int peer, int tag);

  // Runs a backend group's operation in issue order, like execute() / submit().
  std::shared_ptr<Work> runOnBackend(bool async, const BackendOp& op, const CallOptions& call);

  transport::Endpoint& endpoint() { return *endpoint_; }
  AllreduceAlgorithm allreduceAlgorithm(const CallOptions& call) const;

 private:
  friend class OpContext;
  Group(std::shared_ptr<store::Store> root, std::string prefix, int rank, int size, uint32_t id,
        GroupOptions options, std::string secret, std::shared_ptr<void> secretHolder,
        std::shared_ptr<transport::Acceptor> acceptor);
  Group(std::shared_ptr<Backend> backend, GroupOptions options);
  void runOp(transport::OpCode op, transport::FrameHeader base, const CallOptions& call,
             const std::function<void(OpContext&)>& body);
  void runBackendOp(const BackendOp& op, const CallOptions& call);
  // A backend operation cannot be cancelled: after one failed, the group refuses the rest.
  void throwIfBackendFailed(const std::string& what) const;
  // Runs `task` in issue order on the caller's thread (or waits for the executor to run it).
  void inOrder(const std::function<void()>& task);
  // Queues `task` in issue order; its Work carries what it threw.
  std::shared_ptr<Work> queue(std::function<void()> task);
  // Where the other ranks are, for a timeout report (Note [Bounded diagnostics]).
  struct ArrivalReport {
    std::string text;
    int silent = -1;        // the one rank that never said it was blocked, if exactly one
    bool answered = false;  // the store answered within the budget
  };
  ArrivalReport arrivalReport();
  // A peer's abort record in the store, if it aborted (Note [Root cause] in group.cpp).
  std::optional<transport::Failure> abortRecord(int peer);
  // Writes this rank's abort record (bounded; Note [Bounded diagnostics]).
  void recordFailure(const transport::Failure& failure);
  friend class P2pChannel;  // records and looks up failures of its channel in this group
  // Aborts the group for `error` (any exception from inside an operation) and throws.
  [[noreturn]] void fail(const transport::FrameHeader& base, std::exception_ptr error);
  std::string withContext(const transport::FrameHeader& base, const std::string& what) const;

  std::shared_ptr<store::Store> root_;  // unscoped, for sub-groups
  std::string prefix_;
  uint64_t generation_ = 0;
  std::shared_ptr<store::Store> store_;  // scoped to this group
  BoundedStore diagnostics_;             // store_, for failure reports only
  int rank_;
  int size_;
  uint32_t id_;
  GroupOptions options_;
  std::string secret_;
  std::shared_ptr<void> secretHolder_;
  // This rank's listener for the world (shared with the world's other groups); before
  // endpoint_, which unregisters from it.
  std::shared_ptr<transport::Acceptor> acceptor_;
  std::unique_ptr<transport::Endpoint> endpoint_;  // native engine only
  std::shared_ptr<Backend> backend_;               // external library only
  std::string backendFailure_;                     // set once a backend operation failed
  bool allShm_ = false;
  uint64_t nextSeq_ = 0;
  uint64_t splits_ = 0;
  Executor executor_;
  std::mutex p2pMutex_;
  // Closed by the destructor first: the channels use this group until they are closed.
  std::map<std::pair<int, int>, std::shared_ptr<P2pChannel>> p2p_;
};

}  // namespace shoal::comm
