// Broadcast along a binomial tree rooted at `root`, pipelined in segments: a rank forwards
// segment k to its children as soon as segment k arrived from its parent. log2(n) hops of
// latency for small buffers; for large ones every link streams concurrently.
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

namespace {
constexpr size_t kSegmentBytes = 1 << 20;
}  // namespace

TreePosition binomialTree(int rank, int root, int n) {
  TreePosition t;
  const int v = (rank - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      t.parent = ((v - mask) + root) % n;
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) t.children.push_back((v + mask + root) % n);
  }
  return t;
}

void broadcast(OpContext& ctx, const Operation& op) {
  if (ctx.size() == 1) return;
  const size_t total = op.count * elementSize(op.type);
  auto* bytes = static_cast<uint8_t*>(op.recv);
  const auto tree = binomialTree(ctx.rank(), op.root, ctx.size());
  const int nseg =
      static_cast<int>(std::max<size_t>(1, (total + kSegmentBytes - 1) / kSegmentBytes));
  std::vector<transport::Transfer> batch;
  for (int k = 0; k < nseg; ++k) {
    const size_t off = blockBegin(total, nseg, k);
    const size_t len = blockSize(total, nseg, k);
    int received = -1;
    if (tree.parent >= 0) {
      batch.push_back(ctx.recv(tree.parent, static_cast<uint32_t>(k), bytes + off, len));
      received = static_cast<int>(batch.size() - 1);
    }
    for (int child : tree.children) {
      batch.push_back(ctx.send(child, static_cast<uint32_t>(k), bytes + off, len));
      batch.back().after = received;
    }
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
