// Ring all-gather: each rank copies its block into place, then for n-1 steps sends to r+1 the
// block it received last (its own first) and receives the next one from r-1. Each rank sends
// and receives (n-1) blocks; sends are forwarded as soon as the block arrived.
#include <cstring>

#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> allgatherImpl(Group& g, bool async, const void* send, void* recv,
                                    size_t count, DataType type, const CallOptions& call) {
  detail::checkBuffer(g, send, count, type, "allgather");
  detail::checkBuffer(g, recv, count, type, "allgather");
  auto base = detail::baseHeader(count, type);
  return detail::dispatch(
      g, async, op::kAllgather, base, call, {send, recv}, [=](OpContext& ctx) {
        const int n = ctx.size(), r = ctx.rank();
        const size_t block = count * elementSize(type);
        auto* out = static_cast<uint8_t*>(recv);
        if (block > 0 && out + r * block != send) std::memmove(out + r * block, send, block);
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
      });
}

}  // namespace

void allgather(Group& g, const void* send, void* recv, size_t count, DataType type,
               const CallOptions& call) {
  allgatherImpl(g, false, send, recv, count, type, call);
}

std::shared_ptr<Work> allgatherAsync(Group& g, const void* send, void* recv, size_t count,
                                     DataType type, const CallOptions& call) {
  return allgatherImpl(g, true, send, recv, count, type, call);
}

}  // namespace shoal::comm
