// Dissemination barrier: in round j (distance d = 2^j) rank r sends an empty frame to r+d and
// waits for one from r-d. After ceil(log2 n) rounds every rank has heard, transitively, from
// every other, so none leaves before all entered.
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void barrier(OpContext& ctx, const Operation&) {
  const int n = ctx.size(), r = ctx.rank();
  std::vector<transport::Transfer> batch;
  int lastRecv = -1;
  uint32_t round = 0;
  for (int d = 1; d < n; d <<= 1, ++round) {
    batch.push_back(ctx.send((r + d) % n, round, nullptr, 0));
    batch.back().after = lastRecv;
    batch.push_back(ctx.recv((r - d + n) % n, round, nullptr, 0));
    lastRecv = static_cast<int>(batch.size() - 1);
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
