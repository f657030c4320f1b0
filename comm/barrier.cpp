// Dissemination barrier: in round j (distance d = 2^j) rank r sends an empty frame to r+d and
// waits for one from r-d. After ceil(log2 n) rounds every rank has heard, transitively, from
// every other, so none leaves before all entered.
#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> barrierImpl(Group& g, bool async, const CallOptions& call) {
  auto base = detail::baseHeader(0, DataType::kUInt8);
  return detail::dispatch(g, async, op::kBarrier, base, call, {},
                          [](OpContext& ctx) {
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
                          });
}

}  // namespace

void barrier(Group& g, const CallOptions& call) {
  barrierImpl(g, false, call);
}

std::shared_ptr<Work> barrierAsync(Group& g, const CallOptions& call) {
  return barrierImpl(g, true, call);
}

}  // namespace shoal::comm
