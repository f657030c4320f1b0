// Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an all-gather by
// recursive doubling. Bandwidth-optimal like the ring, in 2 log2(p) steps instead of 2(n-1).
//
// A world that is not a power of two is folded to p ranks first (Note [Power-of-two fold] in
// comm/native/algorithms.h). The buffer (B bytes) is cut into p blocks (sizes differ by at most one
// element); each virtual rank v tracks a range [lo, hi) of blocks it is responsible for,
// initially all p.
// - Reduce-scatter, rounds 1..log2(p), partner v XOR p/2, then v XOR p/4, ... v XOR 1: the
//   range is split in half; the rank whose bit is 0 keeps the low half and sends the high half,
//   its partner the opposite. Each receives the half it keeps and reduces it in. Round j moves
//   B/2^j bytes each way; afterwards v holds one block reduced over all ranks.
// - All-gather, rounds log2(p)+1..2 log2(p), partner v XOR 1, then XOR 2, ... XOR p/2: partners
//   swap their (already final) ranges, which double each round, overwriting.
// Cost per rank: 2(p-1)/p of B each way in 2 log2(p) messages, plus the fold. Empty blocks
// (fewer elements than p) travel as zero-byte messages.
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void allreduceRabenseifner(OpContext& ctx, void* data, size_t count) {
  const size_t esize = elementSize(static_cast<DataType>(ctx.base().dtype));
  const size_t total = count * esize;
  auto* bytes = static_cast<uint8_t*>(data);
  const PowerOfTwoFold shape = powerOfTwoFold(ctx);
  const auto rounds = static_cast<uint32_t>(2 * shape.logp);
  const PowerOfTwoFold f = foldIn(ctx, bytes, total, rounds);
  if (f.vrank < 0) return;

  const int p = f.p;
  auto span = [&](int lo, int hi, size_t* len) {
    const size_t b = blockBegin(count, p, lo);
    *len = (blockBegin(count, p, hi) - b) * esize;
    return bytes + b * esize;
  };
  std::vector<transport::Transfer> batch;
  uint32_t step = 1;
  int lo = 0, hi = p;
  for (int mask = p / 2; mask >= 1; mask >>= 1, ++step) {
    const int partner = f.realRank(f.vrank ^ mask);
    const int mid = (lo + hi) / 2;
    const bool keepLow = (f.vrank & mask) == 0;
    size_t sendLen, keepLen;
    uint8_t* sendPtr = keepLow ? span(mid, hi, &sendLen) : span(lo, mid, &sendLen);
    uint8_t* keepPtr = keepLow ? span(lo, mid, &keepLen) : span(mid, hi, &keepLen);
    batch.clear();
    batch.push_back(ctx.send(partner, step, sendPtr, sendLen));
    // mask 1 completes the block (and divides an average: Note [Average in the last step]);
    // the all-gather then moves finished values.
    batch.push_back(mask == 1 ? ctx.recvReduceFinal(partner, step, keepPtr, keepLen)
                              : ctx.recvReduce(partner, step, keepPtr, keepLen));
    ctx.run(batch);
    (keepLow ? hi : lo) = mid;
  }
  for (int mask = 1; mask < p; mask <<= 1, ++step) {
    const int partner = f.realRank(f.vrank ^ mask);
    const int width = hi - lo;
    const bool low = (f.vrank & mask) == 0;
    const int plo = low ? hi : lo - width, phi = low ? hi + width : lo;
    size_t myLen, theirLen;
    uint8_t* myPtr = span(lo, hi, &myLen);
    uint8_t* theirPtr = span(plo, phi, &theirLen);
    batch.clear();
    batch.push_back(ctx.send(partner, step, myPtr, myLen));
    batch.push_back(ctx.recv(partner, step, theirPtr, theirLen));
    ctx.run(batch);
    lo = std::min(lo, plo);
    hi = std::max(hi, phi);
  }
  foldOut(ctx, f, bytes, total, rounds);
}

}  // namespace shoal::comm::algo
