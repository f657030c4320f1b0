// Driver all-reduce, the baseline: every rank sends its buffer to rank 0, which reduces them
// as they arrive (all receives in flight at once; for an average rank n-1's last, see below)
// and sends the result back to every rank.
// Rank 0 moves 2(n-1) full buffers through its links while the others idle: the bottleneck
// that ring and recursive halving/doubling remove.
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void allreduceDriver(OpContext& ctx, void* data, size_t count) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t total = count * elementSize(static_cast<DataType>(ctx.base().dtype));
  std::vector<transport::Transfer> batch;
  if (r == 0) {
    // An average takes rank n-1's contribution last, on its own, so that its reduction
    // completes every element and divides in the same pass (Note [Average in the last step]);
    // its bytes wait in the link meanwhile. Other ops reduce all ranks in at once.
    const bool average = static_cast<ReduceOp>(ctx.base().redop) == ReduceOp::kAvg;
    const int together = average ? n - 1 : n;
    for (int p = 1; p < together; ++p) batch.push_back(ctx.recvReduce(p, 0, data, total));
    ctx.run(batch);
    batch.clear();
    if (average) {
      batch.push_back(ctx.recvReduceFinal(n - 1, 0, data, total));
      ctx.run(batch);
      batch.clear();
    }
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
