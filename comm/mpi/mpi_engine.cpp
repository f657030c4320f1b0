#include "comm/mpi/mpi_engine.h"

#include <mpi.h>
#include <sched.h>

#include <climits>
#include <thread>

#include "comm/op_code.h"
#include "common/error.h"
#include "common/reduce.h"

namespace shoal::comm::mpi {

namespace {

using transport::OpCode;

// Process-wide MPI state: MPI itself is one per process, so this is too.
class Runtime {
 public:
  static Runtime& get() {
    static Runtime runtime;
    return runtime;
  }

  MPI_Datatype half() const { return half_; }
  MPI_Datatype bhalf() const { return bhalf_; }
  MPI_Op userOp(ReduceOp op) const { return userOps_[static_cast<int>(op)]; }

  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& op : userOps_) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
    MPI_Type_free(&half_);
    MPI_Type_free(&bhalf_);
    if (owner_) MPI_Finalize();
  }

 private:
  Runtime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        SHOAL_THROW(SystemError, "MPI_Init_thread failed");
      }
      owner_ = true;
      if (provided < MPI_THREAD_SERIALIZED) {
        SHOAL_THROW(SystemError, "this MPI provides thread level {}, Shoal needs SERIALIZED ({})",
                    provided, MPI_THREAD_SERIALIZED);
      }
    }
    // Two distinct 2-byte types, so the user operations can tell float16 from bfloat16.
    MPI_Type_contiguous(2, MPI_BYTE, &half_);
    MPI_Type_commit(&half_);
    MPI_Type_contiguous(2, MPI_BYTE, &bhalf_);
    MPI_Type_commit(&bhalf_);
    MPI_Op_create(&sixteenBit<ReduceOp::kSum>, 1, &userOps_[static_cast<int>(ReduceOp::kSum)]);
    MPI_Op_create(&sixteenBit<ReduceOp::kMin>, 1, &userOps_[static_cast<int>(ReduceOp::kMin)]);
    MPI_Op_create(&sixteenBit<ReduceOp::kMax>, 1, &userOps_[static_cast<int>(ReduceOp::kMax)]);
    MPI_Op_create(&sixteenBit<ReduceOp::kProduct>, 1,
                  &userOps_[static_cast<int>(ReduceOp::kProduct)]);
  }

  // MPI's contract for user operations: inout[i] = in[i] (op) inout[i].
  template <ReduceOp kOp>
  static void sixteenBit(void* in, void* inout, int* len, MPI_Datatype* type) {
    const DataType t = *type == get().half_ ? DataType::kFloat16 : DataType::kBFloat16;
    reduceInto(inout, in, static_cast<size_t>(*len), t, kOp);
  }

  bool owner_ = false;
  MPI_Datatype half_ = MPI_DATATYPE_NULL;
  MPI_Datatype bhalf_ = MPI_DATATYPE_NULL;
  MPI_Op userOps_[kNumReduceOps] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                                    MPI_OP_NULL};
};

MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kFloat16:
      return Runtime::get().half();
    case DataType::kBFloat16:
      return Runtime::get().bhalf();
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kUInt8:
      return MPI_UINT8_T;
  }
  SHOAL_THROW(InvalidArgument, "mpi: data type {} has no MPI type", static_cast<int>(t));
}

MPI_Op mpiOp(ReduceOp op, DataType t) {
  if (t == DataType::kFloat16 || t == DataType::kBFloat16) {
    return Runtime::get().userOp(op == ReduceOp::kAvg ? ReduceOp::kSum : op);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // the group divides afterwards
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kProduct:
      return MPI_PROD;
  }
  SHOAL_THROW(InvalidArgument, "mpi: reduce op {} has no MPI operation", static_cast<int>(op));
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  SHOAL_THROW(Error, "{}: {}", call, std::string(text, static_cast<size_t>(len)));
}

// Completes `request` by testing it, yielding the core between tests and then sleeping in
// growing steps (OpenMPI progresses inside MPI_Test, so it must keep being called).
void complete(MPI_Request& request, const Deadline& deadline, const char* call) {
  auto pause = std::chrono::microseconds(20);
  for (int i = 0;; ++i) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    if (deadline.expired()) {
      SHOAL_THROW(TimeoutError, "{} still incomplete after {:.1f} s", call,
                  deadline.timeoutSeconds());
    }
    if (i < 200) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
}

int mpiCount(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    SHOAL_THROW(InvalidArgument, "mpi: {} elements exceed MPI's int count limit", count);
  }
  return static_cast<int>(count);
}

class MpiEngine final : public Engine {
 public:
  explicit MpiEngine(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiEngine() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void run(const Operation& o, uint64_t seq, const Deadline& deadline) override {
    what_ = o.op == op::kSendRecv
                ? fmt::format("mpi {} {}", o.isSend ? "send to" : "recv from", o.root)
                : fmt::format("mpi {} (seq {})", opName(o.op), seq);
    timeout_ = deadline.timeoutSeconds();
    const int n = mpiCount(o.count);
    const MPI_Datatype t = mpiType(o.type);
    MPI_Request req = MPI_REQUEST_NULL;
    const char* call = "MPI";
    // OpCode names only kNone: its values are compared as the numbers they are.
    switch (static_cast<uint8_t>(o.op)) {
      case static_cast<uint8_t>(op::kAllreduce):
        call = "MPI_Iallreduce";
        check(MPI_Iallreduce(MPI_IN_PLACE, o.recv, n, t, mpiOp(o.redop, o.type), comm_, &req),
              call);
        break;
      case static_cast<uint8_t>(op::kBroadcast):
        call = "MPI_Ibcast";
        check(MPI_Ibcast(o.recv, n, t, o.root, comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kReduce):
        call = "MPI_Ireduce";
        check(
            MPI_Ireduce(rank_ == o.root ? MPI_IN_PLACE : o.recv, rank_ == o.root ? o.recv : nullptr,
                        n, t, mpiOp(o.redop, o.type), o.root, comm_, &req),
            call);
        break;
      case static_cast<uint8_t>(op::kAllgather):
        call = "MPI_Iallgather";
        check(MPI_Iallgather(o.send, n, t, o.recv, n, t, comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kReduceScatter):
        call = "MPI_Ireduce_scatter_block";
        check(MPI_Ireduce_scatter_block(o.send, o.recv, n, t, mpiOp(o.redop, o.type), comm_, &req),
              call);
        break;
      case static_cast<uint8_t>(op::kAlltoall):
        call = "MPI_Ialltoall";
        check(MPI_Ialltoall(o.send, n, t, o.recv, n, t, comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kGather):
        call = "MPI_Igather";
        check(MPI_Igather(o.send, n, t, o.recv, n, t, o.root, comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kScatter):
        call = "MPI_Iscatter";
        check(MPI_Iscatter(o.send, n, t, o.recv, n, t, o.root, comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kBarrier):
        call = "MPI_Ibarrier";
        check(MPI_Ibarrier(comm_, &req), call);
        break;
      case static_cast<uint8_t>(op::kSendRecv):
        call = o.isSend ? "MPI_Isend" : "MPI_Irecv";
        check(o.isSend ? MPI_Isend(o.send, n, t, o.root, 0, comm_, &req)
                       : MPI_Irecv(o.recv, n, t, o.root, 0, comm_, &req),
              call);
        break;
      default:
        SHOAL_THROW(InvalidArgument, "mpi: {} is not supported", opName(o.op));
    }
    complete(req, deadline, call);
    // MPI has no average and its reductions give no hook into their last step, so an average
    // runs as MPI's sum followed by one pass of division here (the native engine folds the
    // division into its last receive-reduce: Note [Average in the last step]).
    if (o.redop == ReduceOp::kAvg && size_ > 1 &&
        (o.op == op::kAllreduce || o.op == op::kReduce || o.op == op::kReduceScatter)) {
      if (o.op != op::kReduce || rank_ == o.root) scaleAverage(o.recv, o.count, o.type, size_);
    }
  }

  // MPI cannot cancel an operation it started, nor tell the peers: the group refuses the rest
  // (Group's policy), and the error says which call failed.
  std::exception_ptr abort(std::exception_ptr error, bool& fatal) noexcept override {
    fatal = true;
    try {
      try {
        std::rethrow_exception(error);
      } catch (const TimeoutError& e) {
        SHOAL_THROW(TimeoutError, "rank {}: {} timed out after {:.1f} s: {}", rank_, what_,
                    timeout_, e.what());
      } catch (const InvalidArgument&) {
        fatal = false;  // refused before anything moved: the group is still usable
        throw;
      } catch (const Error& e) {
        SHOAL_THROW(PeerError, "rank {}: {} failed: {}", rank_, what_, e.what());
      }
    } catch (...) {
      return std::current_exception();
    }
  }

  std::shared_ptr<Engine> split(int color, int key, const Deadline&) override {
    what_ = "mpi split";
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiEngine>(sub);
  }

  // Point-to-point runs in issue order with the collectives (MPI_THREAD_SERIALIZED), tag 0.
  std::shared_ptr<Work> post(const Operation&, Duration) override { return nullptr; }
  bool supportsTags() const override { return false; }

 private:
  MPI_Comm comm_;
  std::string what_;  // the call running (or that ran last), for abort()
  double timeout_ = 0;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::shared_ptr<Engine> worldEngine() {
  Runtime::get();
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  return std::make_shared<MpiEngine>(comm);
}

std::string broadcastFromRankZero(const std::string& value, Duration timeout) {
  Runtime::get();
  Deadline deadline(timeout);
  uint64_t len = value.size();
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req), "MPI_Ibcast");
  complete(req, deadline, "MPI_Ibcast (rendezvous)");
  SHOAL_CHECK(len < (1u << 20), "mpi rendezvous: implausible length {}", len);
  std::string out = value;
  out.resize(len);
  check(MPI_Ibcast(out.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD, &req),
        "MPI_Ibcast");
  complete(req, deadline, "MPI_Ibcast (rendezvous)");
  return out;
}

}  // namespace shoal::comm::mpi
