// Recursive halving/doubling all-reduce (Rabenseifner), with plain recursive doubling for
// small buffers.
//
// World sizes that are not a power of two are folded first: with p the largest power of two
// <= n and e = n - p, ranks 0..2e-1 pair up; each even rank sends its whole buffer to the odd
// rank above it (which reduces it in) and sits out. The p remaining ranks renumber 0..p-1
// ("virtual ranks"). At the end each odd rank sends the result back to its even partner.
//
// Among the p ranks, in round j the partner is vrank XOR 2^j:
// - small buffers (fewer elements than p, or up to kSmallBytes): log2(p) rounds of swapping
//   the whole buffer and reducing; latency-optimal (log2 p messages).
// - large buffers: reduce-scatter by recursive halving (partners swap half of their current
//   range and keep reducing the other half: log2 p rounds, (p-1)/p of the buffer sent), then
//   all-gather by recursive doubling (the ranges swap back and double). Same bytes as the
//   ring, in 2 log2 p steps instead of 2(p-1).
#include <cstring>
#include <vector>

#include "comm/algorithms.h"

namespace shoal::comm::algo {

namespace {
constexpr size_t kSmallBytes = 64 << 10;
}

void allreduceRecursiveDoubling(OpContext& ctx, void* data, size_t count) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t esize = elementSize(static_cast<DataType>(ctx.base().dtype));
  const size_t total = count * esize;
  auto* bytes = static_cast<uint8_t*>(data);
  int p = 1, logp = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++logp;
  }
  const int extra = n - p;
  const bool small = count < static_cast<size_t>(p) || total <= kSmallBytes;
  const uint32_t unfoldStep = static_cast<uint32_t>(1 + (small ? logp : 2 * logp));
  auto realRank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };

  std::vector<transport::Transfer> batch;
  if (r < 2 * extra && r % 2 == 0) {
    // Folded out: hand the buffer over, then wait for the result.
    batch.push_back(ctx.send(r + 1, 0, bytes, total));
    batch.push_back(ctx.recv(r + 1, unfoldStep, bytes, total));
    batch.back().after = 0;
    ctx.run(batch);
    return;
  }
  if (r < 2 * extra) {
    batch.push_back(ctx.recvReduce(r - 1, 0, bytes, total));
    ctx.run(batch);
  }
  const int vrank = r < 2 * extra ? r / 2 : r - extra;
  uint32_t step = 1;

  if (small) {
    std::vector<uint8_t> mine(total);
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int partner = realRank(vrank ^ mask);
      // Send a snapshot: the buffer itself is being reduced into while it leaves.
      std::memcpy(mine.data(), bytes, total);
      batch.clear();
      batch.push_back(ctx.send(partner, step, mine.data(), total));
      batch.push_back(ctx.recvReduce(partner, step, bytes, total));
      ctx.run(batch);
    }
  } else {
    auto span = [&](int lo, int hi, size_t* len) {
      size_t b = blockBegin(count, p, lo);
      *len = (blockBegin(count, p, hi) - b) * esize;
      return bytes + b * esize;
    };
    int lo = 0, hi = p;
    for (int mask = p / 2; mask >= 1; mask >>= 1, ++step) {
      const int partner = realRank(vrank ^ mask);
      const int mid = (lo + hi) / 2;
      const bool keepLow = (vrank & mask) == 0;
      size_t sendLen, keepLen;
      uint8_t* sendPtr = keepLow ? span(mid, hi, &sendLen) : span(lo, mid, &sendLen);
      uint8_t* keepPtr = keepLow ? span(lo, mid, &keepLen) : span(mid, hi, &keepLen);
      batch.clear();
      batch.push_back(ctx.send(partner, step, sendPtr, sendLen));
      batch.push_back(ctx.recvReduce(partner, step, keepPtr, keepLen));
      ctx.run(batch);
      (keepLow ? hi : lo) = mid;
    }
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int partner = realRank(vrank ^ mask);
      const int width = hi - lo;
      const bool low = (vrank & mask) == 0;
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
  }

  if (r < 2 * extra) {
    batch.clear();
    batch.push_back(ctx.send(r - 1, unfoldStep, bytes, total));
    ctx.run(batch);
  }
}

}  // namespace shoal::comm::algo
