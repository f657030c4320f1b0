// Ring all-gather: each rank copies its block into place, then for n-1 steps sends to r+1 the
// block it received last (its own first) and receives the next one from r-1. Each rank sends
// and receives (n-1) blocks; sends are forwarded as soon as the block arrived.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void allgather(OpContext& ctx, const Operation& op) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t block = op.count * elementSize(op.type);
  auto* out = static_cast<uint8_t*>(op.recv);
  if (block > 0 && out + r * block != op.send) std::memmove(out + r * block, op.send, block);
  std::vector<transport::Transfer> batch;
  int lastRecv = -1;
  for (int s = 0; s < n - 1; ++s) {
    const int sendBlock = (r - s + n) % n, recvBlock = (r - s - 1 + 2 * n) % n;
    batch.push_back(
        ctx.send((r + 1) % n, static_cast<uint32_t>(s), out + sendBlock * block, block));
    batch.back().after = lastRecv;
    batch.push_back(
        ctx.recv((r + n - 1) % n, static_cast<uint32_t>(s), out + recvBlock * block, block));
    lastRecv = static_cast<int>(batch.size() - 1);
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
