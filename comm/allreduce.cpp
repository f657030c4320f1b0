// All-reduce entry point and the algorithm choice.
//
// Automatic choice (overridden per call, or for the group by SHOAL_ALLREDUCE_ALGORITHM):
// - up to kLatencyBytes: recursive doubling — log2(n) rounds, latency dominates;
// - above: ring — bandwidth-optimal and pipelined in segments. For n = 2 both algorithms move
//   the same bytes; for larger n the ring's longer latency is hidden by the pipeline.
// The driver algorithm is never chosen automatically: it is the baseline.
#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"
#include "common/reduce.h"

namespace shoal::comm {

namespace {

constexpr size_t kLatencyBytes = 256 << 10;

AllreduceAlgorithm choose(const Group& g, AllreduceAlgorithm requested, size_t bytes) {
  if (requested != AllreduceAlgorithm::kAuto) return requested;
  return bytes <= kLatencyBytes ? AllreduceAlgorithm::kRecursiveDoubling
                                : AllreduceAlgorithm::kRing;
}

std::shared_ptr<Work> allreduceImpl(Group& g, bool async, void* data, size_t count,
                                    DataType type, ReduceOp op, const CallOptions& call) {
  detail::checkBuffer(g, data, count, type, "allreduce");
  detail::checkReduceOp(op);
  auto algorithm = choose(g, g.allreduceAlgorithm(call), count * elementSize(type));
  auto base = detail::baseHeader(count, type, op);
  base.algo = static_cast<uint8_t>(algorithm);
  return detail::dispatch(g, async, transport::OpCode::kAllreduce, base, call,
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

std::shared_ptr<Work> allreduceAsync(Group& g, void* data, size_t count, DataType type,
                                     ReduceOp op, const CallOptions& call) {
  return allreduceImpl(g, true, data, count, type, op, call);
}

}  // namespace shoal::comm
