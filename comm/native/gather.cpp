// Gather to `root`, direct: every rank sends its block to the root, which receives from all of
// them at once into their places. n-1 messages through the root's links, one hop each.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void gather(OpContext& ctx, const Operation& op) {
  const size_t block = op.count * elementSize(op.type);
  std::vector<transport::Transfer> batch;
  if (ctx.rank() == op.root) {
    auto* out = static_cast<uint8_t*>(op.recv);
    if (block > 0) std::memmove(out + op.root * block, op.send, block);
    for (int p = 0; p < ctx.size(); ++p) {
      if (p != op.root) batch.push_back(ctx.recv(p, 0, out + p * block, block));
    }
  } else {
    batch.push_back(ctx.send(op.root, 0, op.send, block));
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
