// Ring reduce-scatter: the first half of the ring all-reduce, shifted by one block so that rank
// r ends with block r. At step s rank r sends block (r-s-1) to r+1 and receives block (r-s-2)
// from r-1, reducing it in as it arrives; after n-1 steps block r holds every rank's
// contribution. Works on a scratch copy: the send buffer is left unchanged.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void reduceScatter(OpContext& ctx, const Operation& op) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t block = op.count * elementSize(op.type);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const auto* in = static_cast<const uint8_t*>(op.send);
  std::vector<uint8_t> scratch(in, in + block * n);
  std::vector<transport::Transfer> batch;
  int lastRecv = -1;
  for (int s = 0; s < n - 1; ++s) {
    batch.push_back(ctx.send((r + 1) % n, static_cast<uint32_t>(s),
                             scratch.data() + mod(r - s - 1) * block, block));
    batch.back().after = lastRecv;
    // The last step completes block r (and divides an average: Note [Average in the last step]
    // in algorithms.h).
    const int from = (r + n - 1) % n;
    const auto step = static_cast<uint32_t>(s);
    uint8_t* into = scratch.data() + mod(r - s - 2) * block;
    batch.push_back(s == n - 2 ? ctx.recvReduceFinal(from, step, into, block)
                               : ctx.recvReduce(from, step, into, block));
    lastRecv = static_cast<int>(batch.size() - 1);
  }
  ctx.run(batch);
  if (block > 0) std::memcpy(op.recv, scratch.data() + r * block, block);
}

}  // namespace shoal::comm::algo
