// Driver all-reduce, the baseline: every rank sends its buffer to rank 0, which reduces them
// as they arrive (all receives in flight at once) and sends the result back to every rank.
// Rank 0 moves 2(n-1) full buffers through its links while the others idle: the bottleneck
// that ring and recursive halving/doubling remove.
#include <vector>

#include "comm/algorithms.h"

namespace shoal::comm::algo {

void allreduceDriver(OpContext& ctx, void* data, size_t count) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t total = count * elementSize(static_cast<DataType>(ctx.base().dtype));
  std::vector<transport::Transfer> batch;
  if (r == 0) {
    for (int p = 1; p < n; ++p) batch.push_back(ctx.recvReduce(p, 0, data, total));
    ctx.run(batch);
    batch.clear();
    for (int p = 1; p < n; ++p) batch.push_back(ctx.send(p, 1, data, total));
    ctx.run(batch);
  } else {
    batch.push_back(ctx.send(0, 0, data, total));
    batch.push_back(ctx.recv(0, 1, data, total));
    batch.back().after = 0;
    ctx.run(batch);
  }
}

}  // namespace shoal::comm::algo
