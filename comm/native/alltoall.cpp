// All-to-all by pairwise exchange: with every peer at once, rank r sends block j of its send
// buffer to rank j and receives rank j's block r into block j of its receive buffer. Each link
// carries exactly one block each way; the progress loop interleaves them all.
#include <cstring>
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void alltoall(OpContext& ctx, const Operation& op) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t block = op.count * elementSize(op.type);
  const auto* in = static_cast<const uint8_t*>(op.send);
  auto* out = static_cast<uint8_t*>(op.recv);
  if (block > 0) std::memmove(out + r * block, in + r * block, block);
  std::vector<transport::Transfer> batch;
  // Start with the nearest peers so that no rank is everybody's first target.
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    batch.push_back(ctx.send(to, 0, in + to * block, block));
    batch.push_back(ctx.recv(from, 0, out + from * block, block));
  }
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
