// An external collective library a Group can hand its operations to (OpenMPI: comm/mpi/).
//
// A Group made with a backend keeps its own contract (issue order, async handles, per-call
// deadlines, a failed group refuses later calls); the backend only moves the data. It does not
// check that ranks agree on count, type or root the way the native engine's frame headers do:
// MPI leaves that to the caller.
//
// Threading: run() and split() are called by one thread at a time per backend (the group's
// executor serializes them), but not always by the same thread.
#pragma once

#include <memory>
#include <string_view>

#include "common/deadline.h"
#include "common/types.h"
#include "transport/frame.h"

namespace shoal::comm {

// One operation, described the way the collective entry points received it (comm/collectives.h
// says what each buffer holds).
struct BackendOp {
  transport::OpCode op = transport::OpCode::kNone;
  const void* send = nullptr;  // allgather, reduce_scatter, alltoall, gather, scatter, send
  void* recv = nullptr;        // the in-place buffer (allreduce, broadcast, reduce) or output
  size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;  // root, or the peer of a send / recv
  bool isSend = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs `op` to completion or throws (TimeoutError once `deadline` expired, Error otherwise).
  // kAvg arrives as a sum: the group divides.
  virtual void run(const BackendOp& op, const Deadline& deadline) = 0;
  // Like MPI_Comm_split; a negative color returns null.
  virtual std::shared_ptr<Backend> split(int color, int key) = 0;
};

}  // namespace shoal::comm
