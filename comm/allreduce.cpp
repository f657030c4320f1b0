// All-reduce entry point and the algorithm choice.
//
// choose() resolves a request to the algorithm that runs (algo::AllreduceKind). A forced
// algorithm (per call, or for the group by SHOAL_ALLREDUCE_ALGORITHM) runs as named at every
// size. `auto` picks from the crossovers measured in bench/results/allreduce.md, by the bytes
// per rank and whether every link of this rank is shared memory ("shm") or not ("tcp"):
//
//   bytes per rank                       | algorithm
//   <= 64 KiB                            | recursive doubling: log2(n) rounds, latency dominates
//   <= 256 KiB (shm), <= 128 KiB (tcp)   | Rabenseifner
//   <= 16 MiB (shm), <= 1 MiB (tcp),     | Rabenseifner: 2 log2(n) steps against the ring's
//     and n a power of two               |   2(n-1), and no fold
//   anything else                        | ring: bandwidth-optimal and pipelined in segments
//
// The driver algorithm is never chosen automatically: it is the baseline. The README's table
// ("How `auto` picks an all-reduce algorithm") repeats this one: change both together.
#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"
#include "common/error.h"

namespace shoal::comm {

namespace {

constexpr size_t kRecursiveDoublingBytes = 64u << 10;

algo::AllreduceKind choose(const Group& g, AllreduceAlgorithm requested, size_t bytes) {
  using algo::AllreduceKind;
  switch (requested) {
    case AllreduceAlgorithm::kRing:
      return AllreduceKind::kRing;
    case AllreduceAlgorithm::kRecursiveDoubling:
      return AllreduceKind::kRecursiveDoubling;
    case AllreduceAlgorithm::kDriver:
      return AllreduceKind::kDriver;
    case AllreduceAlgorithm::kAuto:
      break;
    case AllreduceAlgorithm::kRabenseifner:
      return AllreduceKind::kRabenseifner;
    default:
      SHOAL_THROW(InvalidArgument, "allreduce: unknown algorithm {}", static_cast<int>(requested));
  }
  const int n = g.size();
  const bool powerOfTwo = (n & (n - 1)) == 0;
  const bool shm = g.allLinksShm();
  const size_t latencyBytes = shm ? (256u << 10) : (128u << 10);
  const size_t halvingBytes = shm ? (16u << 20) : (1u << 20);
  if (bytes <= kRecursiveDoublingBytes) return AllreduceKind::kRecursiveDoubling;
  if (bytes <= latencyBytes || (powerOfTwo && bytes <= halvingBytes)) {
    return AllreduceKind::kRabenseifner;
  }
  return AllreduceKind::kRing;
}

std::shared_ptr<Work> allreduceImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                    ReduceOp op, const CallOptions& call) {
  detail::checkBuffer(g, data, count, type, "allreduce");
  detail::checkReduceOp(op);
  auto algorithm = choose(g, g.allreduceAlgorithm(call), count * elementSize(type));
  auto base = detail::baseHeader(count, type, op);
  base.algo = static_cast<uint8_t>(algorithm);
  return detail::dispatch(g, async, op::kAllreduce, base, call, {.recv = data},
                          [=](OpContext& ctx) {
                            // kAvg divides inside each algorithm's last
                            // reduction (Note [Average in the last step]).
                            if (ctx.size() > 1) {
                              switch (algorithm) {
                                case algo::AllreduceKind::kRing:
                                  algo::allreduceRing(ctx, data, count);
                                  break;
                                case algo::AllreduceKind::kRecursiveDoubling:
                                  algo::allreduceRecursiveDoubling(ctx, data, count);
                                  break;
                                case algo::AllreduceKind::kRabenseifner:
                                  algo::allreduceRabenseifner(ctx, data, count);
                                  break;
                                case algo::AllreduceKind::kDriver:
                                  algo::allreduceDriver(ctx, data, count);
                                  break;
                              }
                            }
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
