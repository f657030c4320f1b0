// The collective entry points: argument checks, then the operation as a description
// (comm/engine.h) for the group to run on its engine. No engine is known here.
#include "comm/collectives.h"

#include "comm/collective_util.h"

namespace shoal::comm {

namespace {

using detail::checkBuffer;
using detail::checkReduceOp;
using detail::checkRoot;

std::shared_ptr<Work> run(Group& g, bool async, const Operation& op, const CallOptions& call) {
  return g.run(op, call, async);
}

Operation inPlace(transport::OpCode code, void* data, size_t count, DataType type,
                  ReduceOp redop = ReduceOp::kSum, int root = 0) {
  return {.op = code, .recv = data, .count = count, .type = type, .redop = redop, .root = root};
}

Operation sendRecv(transport::OpCode code, const void* send, void* recv, size_t count,
                   DataType type, ReduceOp redop = ReduceOp::kSum, int root = 0) {
  return {.op = code,
          .send = send,
          .recv = recv,
          .count = count,
          .type = type,
          .redop = redop,
          .root = root};
}

std::shared_ptr<Work> allreduceImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                    ReduceOp op, const CallOptions& call) {
  checkBuffer(g, data, count, type, "allreduce");
  checkReduceOp(op);
  return run(g, async, inPlace(op::kAllreduce, data, count, type, op), call);
}

std::shared_ptr<Work> broadcastImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                    int root, const CallOptions& call) {
  checkBuffer(g, data, count, type, "broadcast");
  checkRoot(g, root, "broadcast");
  return run(g, async, inPlace(op::kBroadcast, data, count, type, ReduceOp::kSum, root), call);
}

std::shared_ptr<Work> reduceImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                 ReduceOp op, int root, const CallOptions& call) {
  checkBuffer(g, data, count, type, "reduce");
  checkRoot(g, root, "reduce");
  checkReduceOp(op);
  return run(g, async, inPlace(op::kReduce, data, count, type, op, root), call);
}

std::shared_ptr<Work> allgatherImpl(Group& g, bool async, const void* send, void* recv,
                                    size_t count, DataType type, const CallOptions& call) {
  checkBuffer(g, send, count, type, "allgather");
  checkBuffer(g, recv, count, type, "allgather");
  return run(g, async, sendRecv(op::kAllgather, send, recv, count, type), call);
}

std::shared_ptr<Work> reduceScatterImpl(Group& g, bool async, const void* send, void* recv,
                                        size_t count, DataType type, ReduceOp op,
                                        const CallOptions& call) {
  checkBuffer(g, send, count, type, "reduce_scatter");
  checkBuffer(g, recv, count, type, "reduce_scatter");
  checkReduceOp(op);
  return run(g, async, sendRecv(op::kReduceScatter, send, recv, count, type, op), call);
}

std::shared_ptr<Work> alltoallImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                   DataType type, const CallOptions& call) {
  checkBuffer(g, send, count, type, "alltoall");
  checkBuffer(g, recv, count, type, "alltoall");
  return run(g, async, sendRecv(op::kAlltoall, send, recv, count, type), call);
}

std::shared_ptr<Work> gatherImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                 DataType type, int root, const CallOptions& call) {
  checkBuffer(g, send, count, type, "gather");
  checkRoot(g, root, "gather");
  if (g.rank() == root) checkBuffer(g, recv, count, type, "gather");
  return run(g, async, sendRecv(op::kGather, send, recv, count, type, ReduceOp::kSum, root), call);
}

std::shared_ptr<Work> scatterImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                  DataType type, int root, const CallOptions& call) {
  checkBuffer(g, recv, count, type, "scatter");
  checkRoot(g, root, "scatter");
  if (g.rank() == root) checkBuffer(g, send, count, type, "scatter");
  return run(g, async, sendRecv(op::kScatter, send, recv, count, type, ReduceOp::kSum, root), call);
}

std::shared_ptr<Work> barrierImpl(Group& g, bool async, const CallOptions& call) {
  return run(g, async, inPlace(op::kBarrier, nullptr, 0, DataType::kUInt8), call);
}

}  // namespace

void allreduce(Group& g, void* data, size_t count, DataType type, ReduceOp op,
               const CallOptions& call) {
  allreduceImpl(g, false, data, count, type, op, call);
}
std::shared_ptr<Work> allreduceAsync(Group& g, void* data, size_t count, DataType type, ReduceOp op,
                                     const CallOptions& call) {
  return allreduceImpl(g, true, data, count, type, op, call);
}

void broadcast(Group& g, void* data, size_t count, DataType type, int root,
               const CallOptions& call) {
  broadcastImpl(g, false, data, count, type, root, call);
}
std::shared_ptr<Work> broadcastAsync(Group& g, void* data, size_t count, DataType type, int root,
                                     const CallOptions& call) {
  return broadcastImpl(g, true, data, count, type, root, call);
}

std::string broadcastBytes(Group& g, std::string bytes, int root, size_t maxBytes,
                           const CallOptions& call) {
  int64_t n = static_cast<int64_t>(bytes.size());
  broadcast(g, &n, 1, DataType::kInt64, root, call);
  if (n < 0 || static_cast<uint64_t>(n) > maxBytes) {
    SHOAL_THROW(InvalidArgument, "broadcastBytes: rank {} sends {} bytes, more than the {} allowed",
                root, n, maxBytes);
  }
  bytes.resize(static_cast<size_t>(n));
  broadcast(g, bytes.data(), bytes.size(), DataType::kUInt8, root, call);
  return bytes;
}

void reduce(Group& g, void* data, size_t count, DataType type, ReduceOp op, int root,
            const CallOptions& call) {
  reduceImpl(g, false, data, count, type, op, root, call);
}
std::shared_ptr<Work> reduceAsync(Group& g, void* data, size_t count, DataType type, ReduceOp op,
                                  int root, const CallOptions& call) {
  return reduceImpl(g, true, data, count, type, op, root, call);
}

void allgather(Group& g, const void* send, void* recv, size_t count, DataType type,
               const CallOptions& call) {
  allgatherImpl(g, false, send, recv, count, type, call);
}
std::shared_ptr<Work> allgatherAsync(Group& g, const void* send, void* recv, size_t count,
                                     DataType type, const CallOptions& call) {
  return allgatherImpl(g, true, send, recv, count, type, call);
}

void reduceScatter(Group& g, const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                   const CallOptions& call) {
  reduceScatterImpl(g, false, send, recv, count, type, op, call);
}
std::shared_ptr<Work> reduceScatterAsync(Group& g, const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, const CallOptions& call) {
  return reduceScatterImpl(g, true, send, recv, count, type, op, call);
}

void alltoall(Group& g, const void* send, void* recv, size_t count, DataType type,
              const CallOptions& call) {
  alltoallImpl(g, false, send, recv, count, type, call);
}
std::shared_ptr<Work> alltoallAsync(Group& g, const void* send, void* recv, size_t count,
                                    DataType type, const CallOptions& call) {
  return alltoallImpl(g, true, send, recv, count, type, call);
}

void gather(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
            const CallOptions& call) {
  gatherImpl(g, false, send, recv, count, type, root, call);
}
std::shared_ptr<Work> gatherAsync(Group& g, const void* send, void* recv, size_t count,
                                  DataType type, int root, const CallOptions& call) {
  return gatherImpl(g, true, send, recv, count, type, root, call);
}

void scatter(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
             const CallOptions& call) {
  scatterImpl(g, false, send, recv, count, type, root, call);
}
std::shared_ptr<Work> scatterAsync(Group& g, const void* send, void* recv, size_t count,
                                   DataType type, int root, const CallOptions& call) {
  return scatterImpl(g, true, send, recv, count, type, root, call);
}

void barrier(Group& g, const CallOptions& call) {
  barrierImpl(g, false, call);
}
std::shared_ptr<Work> barrierAsync(Group& g, const CallOptions& call) {
  return barrierImpl(g, true, call);
}

}  // namespace shoal::comm
