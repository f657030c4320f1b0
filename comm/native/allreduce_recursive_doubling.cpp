// Recursive doubling all-reduce: latency-optimal, for small buffers.
//
// A world that is not a power of two is folded to p ranks first (Note [Power-of-two fold] in
// comm/native/algorithms.h). Among the p ranks, round j = 1..log2(p) pairs virtual rank v with
// v XOR 2^(j-1): the two swap their whole current buffer (B bytes each way) and each reduces
// the other's into its own. After log2(p) rounds every rank holds the full reduction.
// Cost per rank: log2(p) messages of B bytes each way (plus the fold), against the ring's
// 2(n-1) messages of B/n: fewest steps, most bytes, so it wins only where latency dominates.
// Both partners reduce in the same order of operands per element pair, so results agree
// bit for bit across ranks for commutative ops.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void allreduceRecursiveDoubling(OpContext& ctx, void* data, size_t count) {
  const size_t total = count * elementSize(static_cast<DataType>(ctx.base().dtype));
  auto* bytes = static_cast<uint8_t*>(data);
  const PowerOfTwoFold shape = powerOfTwoFold(ctx);
  const auto rounds = static_cast<uint32_t>(shape.logp);
  const PowerOfTwoFold f = foldIn(ctx, bytes, total, rounds);
  if (f.vrank < 0) return;

  std::vector<uint8_t> mine(total);
  std::vector<transport::Transfer> batch;
  uint32_t step = 1;
  for (int mask = 1; mask < f.p; mask <<= 1, ++step) {
    const int partner = f.realRank(f.vrank ^ mask);
    // Send a snapshot: the buffer itself is being reduced into while it leaves.
    if (total > 0) std::memcpy(mine.data(), bytes, total);  // (no buffer at all when empty)
    batch.clear();
    batch.push_back(ctx.send(partner, step, mine.data(), total));
    // The last round completes the sum (and divides an average: Note [Average in the last
    // step]); the fold-out then hands over the finished values.
    batch.push_back(mask * 2 >= f.p ? ctx.recvReduceFinal(partner, step, bytes, total)
                                    : ctx.recvReduce(partner, step, bytes, total));
    ctx.run(batch);
  }
  foldOut(ctx, f, bytes, total, rounds);
}

}  // namespace shoal::comm::algo
