// The native all-reduce: the algorithm choice, and the hand-off to the algorithm's file.
//
// chooseAllreduce() resolves a request to the algorithm that runs (algo::AllreduceKind). A forced
// algorithm (per call, or for the group by SHOAL_ALLREDUCE_ALGORITHM) runs as named at every
// size. `auto` picks from the crossovers measured in bench/results/allreduce.md, by the bytes
// per rank and whether every link of this rank is shared memory ("shm") or not ("tcp"):
//
//   bytes per rank                       | algorithm
//   <= 64 KiB                            | recursive doubling: log2(n) rounds, latency dominates
//   more, the group on several hosts     | hierarchical: each byte crosses hosts once per
//     with as many ranks on each         |   direction (allreduce_hierarchical.cpp)
//   <= 256 KiB (shm), <= 128 KiB (tcp)   | Rabenseifner
//   <= 16 MiB (shm), <= 1 MiB (tcp),     | Rabenseifner: 2 log2(n) steps against the ring's
//     and n a power of two               |   2(n-1), and no fold
//   anything else                        | ring: bandwidth-optimal and pipelined in segments
//
// A forced hierarchical all-reduce on one host, or on hosts with different numbers of ranks,
// runs the ring. The driver algorithm is never chosen automatically: it is the baseline. The
// README's table
// ("How `auto` picks an all-reduce algorithm") repeats this one: change both together.
#include "comm/native/algorithms.h"
#include "common/error.h"

namespace shoal::comm::algo {

namespace {
constexpr size_t kRecursiveDoublingBytes = 64u << 10;
}  // namespace

AllreduceKind chooseAllreduce(AllreduceAlgorithm requested, int n, bool shm, bool multiHost,
                              size_t bytes) {
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
    case AllreduceAlgorithm::kHierarchical:
      return multiHost ? AllreduceKind::kHierarchical : AllreduceKind::kRing;
    default:
      SHOAL_THROW(InvalidArgument, "allreduce: unknown algorithm {}", static_cast<int>(requested));
  }
  const bool powerOfTwo = (n & (n - 1)) == 0;
  const size_t latencyBytes = shm ? (256u << 10) : (128u << 10);
  const size_t halvingBytes = shm ? (16u << 20) : (1u << 20);
  if (bytes <= kRecursiveDoublingBytes) return AllreduceKind::kRecursiveDoubling;
  if (multiHost) return AllreduceKind::kHierarchical;
  if (bytes <= latencyBytes || (powerOfTwo && bytes <= halvingBytes)) {
    return AllreduceKind::kRabenseifner;
  }
  return AllreduceKind::kRing;
}

void allreduce(OpContext& ctx, const Operation& op) {
  // kAvg divides inside each algorithm's last reduction (Note [Average in the last step]).
  if (ctx.size() == 1) return;
  switch (static_cast<AllreduceKind>(ctx.base().algo)) {
    case AllreduceKind::kRing:
      allreduceRing(ctx, op.recv, op.count);
      break;
    case AllreduceKind::kRecursiveDoubling:
      allreduceRecursiveDoubling(ctx, op.recv, op.count);
      break;
    case AllreduceKind::kRabenseifner:
      allreduceRabenseifner(ctx, op.recv, op.count);
      break;
    case AllreduceKind::kDriver:
      allreduceDriver(ctx, op.recv, op.count);
      break;
    case AllreduceKind::kHierarchical:
      allreduceHierarchical(ctx, op.recv, op.count);
      break;
  }
}

}  // namespace shoal::comm::algo
