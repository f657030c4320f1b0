// Scatter from `root`, direct: the root sends block j to rank j, all at once; every other rank
// receives its block. n-1 messages through the root's links, one hop each.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void scatter(OpContext& ctx, const Operation& op) {
  const size_t block = op.count * elementSize(op.type);
  std::vector<transport::Transfer> batch;
  if (ctx.rank() == op.root) {
    const auto* in = static_cast<const uint8_t*>(op.send);
    if (block > 0) std::memmove(op.recv, in + op.root * block, block);
    for (int p = 0; p < ctx.size(); ++p) {
      if (p != op.root) batch.push_back(ctx.send(p, 0, in + p * block, block));
    }
  } else {
    batch.push_back(ctx.recv(op.root, 0, op.recv, block));
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
