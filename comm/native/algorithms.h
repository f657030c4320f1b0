// Internal: the native engine's algorithms. NativeEngine::run hands each collective to its
// entry point here, inside an OpContext (deadline, framing); each is defined in its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/engine.h"
#include "comm/native/op_context.h"

namespace shoal::comm::algo {

// Elements of block i when `count` elements are split over n blocks as evenly as possible.
inline size_t blockBegin(size_t count, int n, int i) {
  return count / n * i + std::min<size_t>(static_cast<size_t>(i), count % n);
}
inline size_t blockSize(size_t count, int n, int i) {
  return blockBegin(count, n, i + 1) - blockBegin(count, n, i);
}

// One entry point per collective: `op` as the caller described it (comm/engine.h).
void allreduce(OpContext& ctx, const Operation& op);  // allreduce.cpp: by ctx.base().algo
void broadcast(OpContext& ctx, const Operation& op);
void reduce(OpContext& ctx, const Operation& op);
void allgather(OpContext& ctx, const Operation& op);
void reduceScatter(OpContext& ctx, const Operation& op);
void alltoall(OpContext& ctx, const Operation& op);
void gather(OpContext& ctx, const Operation& op);
void scatter(OpContext& ctx, const Operation& op);
void barrier(OpContext& ctx, const Operation& op);

// The all-reduce algorithm that actually runs: what chooseAllreduce() resolves a
// request (kAuto included) to. Its value travels in every frame's `algo` byte, so two ranks
// that resolved differently fail with a MismatchError instead of misreading each other's bytes.
// The first three values equal AllreduceAlgorithm's; 4 is Rabenseifner.
enum class AllreduceKind : uint8_t {
  kRing = 1,               // allreduce_ring.cpp
  kRecursiveDoubling = 2,  // allreduce_recursive_doubling.cpp
  kDriver = 3,             // allreduce_driver.cpp
  kRabenseifner = 4,       // allreduce_rabenseifner.cpp
  kHierarchical = 5,       // allreduce_hierarchical.cpp
};

// Which ranks share a host (from the peers' records: GroupOptions::hostLabel or the machine's
// identity). The same on every rank of a group.
struct HostLayout {
  std::vector<std::vector<int>> ranks;  // each host's ranks, ascending; hosts by lowest rank
  int host = 0;                         // this rank's host
  int local = 0;                        // this rank's index among its host's ranks
  // At least two hosts, each with the same number (at least two) of ranks: the shape the
  // hierarchical all-reduce takes.
  bool uniform() const;
};
HostLayout hostLayout(const std::vector<std::string>& hostOfRank, int rank);

// What `requested` (kAuto included) resolves to for `bytes` per rank over n ranks, `shm`: every
// link of this rank is shared memory, `multiHost`: the group's HostLayout is uniform()
// (allreduce.cpp has the table).
AllreduceKind chooseAllreduce(AllreduceAlgorithm requested, int n, bool shm, bool multiHost,
                              size_t bytes);

// A ring over some of the group's ranks: members[i] is the group rank at ring position i, `me`
// this rank's position.
struct RingSpan {
  std::vector<int> members;
  int me = 0;
};
enum RingParts : int { kRingReduceScatter = 1, kRingAllgather = 2 };
// The parts of a ring all-reduce of data[0..count) (the operation's type) over `ring`
// (allreduce_ring.cpp): after the reduce-scatter, position p holds block (p+1) mod m reduced
// over the ring, its last receive a recvReduceFinal when `completes` (the ring's sum is the
// group's); the all-gather sends each position's block (p+1) mod m around. Frames use steps
// from `firstStep` on.
void ringAllreduceParts(OpContext& ctx, const RingSpan& ring, void* data, size_t count, int parts,
                        bool completes, uint32_t firstStep);

void allreduceRing(OpContext& ctx, void* data, size_t count);
void allreduceHierarchical(OpContext& ctx, void* data, size_t count);
void allreduceRecursiveDoubling(OpContext& ctx, void* data, size_t count);
void allreduceRabenseifner(OpContext& ctx, void* data, size_t count);
void allreduceDriver(OpContext& ctx, void* data, size_t count);

// Note [Average in the last step]
// ReduceOp::kAvg travels as a sum; the division by the group size is not a pass of its own over
// the result. Each algorithm knows the receive-reduce after which an element holds the sum over
// every rank, and makes that one recvReduceFinal (OpContext): it adds the last contribution and
// divides in the same pass (common/reduce.h), so what is forwarded afterwards (a ring's or
// Rabenseifner's all-gather, recursive doubling's fold-out, the driver's broadcast) is already
// the average. Per algorithm:
// - ring: the last reduce-scatter step (the rank that completes a block scales it);
// - recursive doubling: the last round (both partners, alike);
// - Rabenseifner: the last halving round;
// - driver: rank 0's receive from rank n-1, after the others' (a second batch);
// - reduce (reduce.cpp): the root's receive from its largest subtree, after the others;
// - reduce-scatter (reduce_scatter.cpp): the last step.
// A world of one has nothing to divide. Floating-point results equal the sum-then-divide ones
// bit for bit (float16/bfloat16: within one unit in the last place, rounded once instead of
// twice), integers bit for bit.

// Note [Power-of-two fold]
// Recursive doubling and Rabenseifner pair ranks by XOR of their numbers, which needs a
// power-of-two world. Other sizes are folded first: with p the largest power of two <= n and
// e = n - p, ranks 0..2e-1 pair up; each even one sends its whole buffer to the odd rank above
// it (step 0; the odd rank reduces it in) and sits out. The p remaining ranks are renumbered
// 0..p-1 ("virtual ranks") and run the algorithm's rounds (steps 1..rounds). At the end
// (step rounds + 1) each odd rank sends the result back to its even partner. The fold costs
// one extra buffer each way for 2e ranks and two steps of latency.
struct PowerOfTwoFold {
  int p = 1;       // ranks taking part in the rounds
  int logp = 0;    // log2(p)
  int extra = 0;   // n - p
  int vrank = -1;  // this rank among the p, or -1 when it was folded out
  // The real rank of virtual rank v.
  int realRank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};

// The fold's shape for this group, without communicating.
PowerOfTwoFold powerOfTwoFold(const OpContext& ctx);
// Step 0 of the fold (`rounds`: the steps the algorithm uses after it). A folded-out rank has
// received the final result when this returns (vrank == -1: nothing more to do).
PowerOfTwoFold foldIn(OpContext& ctx, void* data, size_t bytes, uint32_t rounds);
// The last step: the odd partners hand the result back. Called by every rank still in.
void foldOut(OpContext& ctx, const PowerOfTwoFold& fold, void* data, size_t bytes, uint32_t rounds);

// Position of `rank` in a binomial tree rooted at `root` over n ranks: its parent (-1 for the
// root) and its children, largest subtree first.
struct TreePosition {
  int parent = -1;
  std::vector<int> children;
};
TreePosition binomialTree(int rank, int root, int n);

}  // namespace shoal::comm::algo
