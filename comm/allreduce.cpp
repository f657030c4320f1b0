// All-reduce entry point and the algorithm choice.
//
// Automatic choice (overridden per call, or for the group by SHOAL_ALLREDUCE_ALGORITHM), from
// the crossovers measured in bench/results/allreduce.md:
// - small buffers: recursive doubling, log2(n) rounds where latency dominates;
// - with a power-of-two world, recursive halving/doubling stays ahead of the ring up to a few
//   MiB (2 log2 n steps against 2(n-1), and no fold step): up to 16 MiB over shared memory,
//   1 MiB over TCP;
// - otherwise the ring: bandwidth-optimal and pipelined in segments, best on TCP above 128 KiB
//   where its segments keep the socket buffers full.
// The driver algorithm is never chosen automatically: it is the baseline.
#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"
#include "common/reduce.h"

namespace shoal::comm {

namespace {

AllreduceAlgorithm choose(const Group& g, AllreduceAlgorithm requested, size_t bytes) {
  if (requested != AllreduceAlgorithm::kAuto) return requested;
  const int n = g.size();
  const bool powerOfTwo = (n & (n - 1)) == 0;
  const bool shm = g.allLinksShm();
  const size_t latencyBytes = shm ? (256u << 10) : (128u << 10);
  const size_t halvingBytes = shm ? (16u << 20) : (1u << 20);
  if (bytes <= latencyBytes || (powerOfTwo && bytes <= halvingBytes)) {
    return AllreduceAlgorithm::kRecursiveDoubling;
  }
  return AllreduceAlgorithm::kRing;
}

std::shared_ptr<Work> allreduceImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                    ReduceOp op, const CallOptions& call) {
  detail::checkBuffer(g, data, count, type, "allreduce");
  detail::checkReduceOp(op);
  auto algorithm = choose(g, g.allreduceAlgorithm(call), count * elementSize(type));
  auto base = detail::baseHeader(count, type, op);
  base.algo = static_cast<uint8_t>(algorithm);
  return detail::dispatch(g, async, transport::OpCode::kAllreduce, base, call, {.recv = data},
                          [=](OpContext& ctx) {
                            if (ctx.size() > 1) {
                              switch (algorithm) {
                                case AllreduceAlgorithm::kRing:
                                  algo::allreduceRing(ctx, data, count);
                                  break;
                                case AllreduceAlgorithm::kDriver:
                                  algo::allreduceDriver(ctx, data, count);
                                  break;
                                default:
                                  algo::allreduceRecursiveDoubling(ctx, data, count);
                              }
                            }
                            if (op == ReduceOp::kAvg) scaleAverage(data, count, type, ctx.size());
                          });
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

}  // namespace shoal::comm
