// What moves a Group's data: the native engine (comm/native/native_engine.h) or an external
// library (OpenMPI: comm/mpi/mpi_engine.h), behind one small interface.
//
// The split of work: Group owns issue order, sequence numbers, deadlines and the failure policy
// (any failure inside an operation fails the group; later calls are refused). An engine only
// runs the operations it is handed, and when one fails, tells its peers as far as it can
// (abort()). Collectives are handed over as descriptions (Operation), so a new engine is one
// class, and the collective entry points (comm/collectives.h) know no engine.
//
// Threading: run(), abort() and split() are called by one thread at a time per engine (the
// group's executor serializes them), not always the same one. post() and interrupt() may come
// from any thread at any time.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/op_code.h"
#include "comm/operation_times.h"
#include "comm/work.h"
#include "common/deadline.h"
#include "common/types.h"

namespace shoal::comm {

enum class AllreduceAlgorithm : uint8_t {
  kAuto = 0,
  kRing = 1,
  kRecursiveDoubling = 2,  // plain recursive doubling: the whole buffer each round
  kDriver = 3,             // reduce to rank 0, then broadcast: the baseline
  kRabenseifner = 4,       // reduce-scatter by recursive halving + all-gather by doubling
  // Reduce-scatter inside each host, all-reduce across hosts, all-gather inside each host
  // (comm/native/allreduce_hierarchical.cpp); the ring where the group is on one host or its
  // hosts hold different numbers of ranks.
  kHierarchical = 5,
};
std::string_view toString(AllreduceAlgorithm a);
AllreduceAlgorithm parseAllreduceAlgorithm(std::string_view name);

// One operation, described the way the entry points of comm/collectives.h received it (that
// header says what each buffer holds). The buffers belong to the operation until it completes.
struct Operation {
  transport::OpCode op = transport::OpCode::kNone;
  const void* send = nullptr;  // allgather, reduce_scatter, alltoall, gather, scatter, send
  void* recv = nullptr;        // the in-place buffer (allreduce, broadcast, reduce) or output
  size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;  // root, or the peer of a send / receive
  // Point-to-point only.
  bool isSend = false;
  int tag = 0;
  // All-reduce only: the caller's choice (kAuto: the engine's).
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // "native", "mpi": for messages and logs.
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The world generation the engine's connections belong to (GroupOptions::generation); 0 for
  // engines without generations.
  virtual uint64_t generation() const { return 0; }

  // Runs `op` (number `seq` in issue order; point-to-point ops run in order get 0) to
  // completion, or throws: TimeoutError once `deadline` expired, another Error otherwise.
  // kAvg means the average, whatever the library offers.
  virtual void run(const Operation& op, uint64_t seq, const Deadline& deadline) = 0;

  // The all-reduce algorithm run() uses for `op` (what it resolves kAuto to), for traces; the
  // request itself where the library chooses out of sight (MPI). Cheap, no communication.
  virtual AllreduceAlgorithm resolveAllreduce(const Operation& op) const { return op.algorithm; }
  // The transport `op`'s messages take, for traces: the native engine names the kinds of this
  // rank's links the operation can use ("shm", "tcp", "tls", several joined by '+', "none" in a
  // group of one; a point-to-point operation its peer's); an engine whose library chooses out
  // of sight, its own name. Static storage; cheap, no communication.
  virtual std::string_view transportOf(const Operation& op) const {
    (void)op;
    return name();
  }

  // Traces (Note [Operation spans] in comm/group.cpp): while `at` is set, the operation
  // running (run(), or a task of the engine's own run in issue order) sets *at, if it holds no
  // time yet (Clock::time_point{}), to when its first message from any peer arrived on this
  // rank. Left as it is where no message arrived or the engine cannot see its messages (MPI).
  // Called around one operation by the thread that runs it: with `at`, then with null.
  virtual void watchFirstArrival(Clock::time_point* at) { (void)at; }

  // Step-time breakdowns (comm/operation_times.h): from now on, each operation run() (or a
  // task of the engine's own run in issue order) completes adds its record to `log`, its first
  // arrival noted as for watchFirstArrival (whether a trace watches or not; failed operations
  // add none); null stops it. Thread-safe: an operation already running records into the log
  // it started with. The default records nothing (an engine that cannot see its messages: MPI).
  virtual void logOperationTimes(std::shared_ptr<OperationTimeLog> log) { (void)log; }

  // Called once, right after run() or split() threw `error`: tells the peers (as far as the
  // engine can) and returns what the caller gets: the error with the cause named (for a
  // timeout, a lost peer, a mismatch, a bad frame), or `error` itself. `fatal` is set to false
  // only when nothing moved and the engine stays usable (an argument the library refused up
  // front); the group then fails that call alone. Never throws.
  virtual std::exception_ptr abort(std::exception_ptr error, bool& fatal) noexcept = 0;

  // Collective, like MPI_Comm_split: the engine of this rank's new group, or null for a
  // negative color. Runs in issue order like an operation.
  virtual std::shared_ptr<Engine> split(int color, int key, const Deadline& deadline) = 0;

  // Not collective: an engine for a group named `name` of `size` ranks that only its members
  // join (Group::connect). InvalidArgument where the engine cannot (MPI).
  virtual std::shared_ptr<Engine> connect(const std::string& name, int rank, int size,
                                          Duration timeout);

  // Point-to-point (the contract of isend / irecv in comm/collectives.h), from any thread:
  // the engine's Work, or null when the engine runs point-to-point in issue order with the
  // collectives (the group then queues `op` as kSendRecv).
  virtual std::shared_ptr<Work> post(const Operation& op, Duration timeout) = 0;
  // A blocking point-to-point transfer (send / recv) moved at once on the calling thread, where
  // the engine has a path for it that is faster than post() and a wait (the native engine: an
  // idle, connected channel). Returns false, having done nothing, where it has not: the caller
  // posts and waits instead. Otherwise as post()'s Work and its wait: returns once complete,
  // throws the failure.
  virtual bool transferNow(const Operation& op, Duration timeout) {
    (void)op;
    (void)timeout;
    return false;
  }
  // Whether point-to-point tags other than 0 work (checked before anything is posted).
  virtual bool supportsTags() const { return true; }

  // Thread-safe: makes the running and every later operation fail, and the peers see this
  // rank leave. A no-op where the library cannot (MPI).
  virtual void interrupt() noexcept {}

  // Thread-safe: bytes this rank has sent to its peers so far (frame headers included), or 0
  // where the library does not say (MPI).
  virtual uint64_t bytesSent() const { return 0; }
};

}  // namespace shoal::comm
