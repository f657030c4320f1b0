// All-to-all by pairwise exchange: with every peer at once, rank r sends block j of its send
// buffer to rank j and receives rank j's block r into block j of its receive buffer. Each link
// carries exactly one block each way; the progress loop interleaves them all.
#include <cstring>

#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> alltoallImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                   DataType type, const CallOptions& call) {
  detail::checkBuffer(g, send, count, type, "alltoall");
  detail::checkBuffer(g, recv, count, type, "alltoall");
  auto base = detail::baseHeader(count, type);
  return detail::dispatch(g, async, op::kAlltoall, base, call, {send, recv},
                          [=](OpContext& ctx) {
                            const int n = ctx.size(), r = ctx.rank();
                            const size_t block = count * elementSize(type);
                            const auto* in = static_cast<const uint8_t*>(send);
                            auto* out = static_cast<uint8_t*>(recv);
                            if (block > 0) std::memmove(out + r * block, in + r * block, block);
                            std::vector<transport::Transfer> batch;
                            // Start with the nearest peers so that no rank is everybody's first
                            // target.
                            for (int s = 1; s < n; ++s) {
                              const int to = (r + s) % n, from = (r - s + n) % n;
                              batch.push_back(ctx.send(to, 0, in + to * block, block));
                              batch.push_back(ctx.recv(from, 0, out + from * block, block));
                            }
                            ctx.run(batch);
                          });
}

}  // namespace

void alltoall(Group& g, const void* send, void* recv, size_t count, DataType type,
              const CallOptions& call) {
  alltoallImpl(g, false, send, recv, count, type, call);
}

std::shared_ptr<Work> alltoallAsync(Group& g, const void* send, void* recv, size_t count,
                                    DataType type, const CallOptions& call) {
  return alltoallImpl(g, true, send, recv, count, type, call);
}

}  // namespace shoal::comm
