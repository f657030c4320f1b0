// Scatter from `root`, direct: the root sends block j to rank j, all at once; every other rank
// receives its block. n-1 messages through the root's links, one hop each.
#include <cstring>

#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> scatterImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                  DataType type, int root, const CallOptions& call) {
  detail::checkBuffer(g, recv, count, type, "scatter");
  detail::checkRoot(g, root, "scatter");
  if (g.rank() == root) detail::checkBuffer(g, send, count, type, "scatter");
  auto base = detail::baseHeader(count, type, ReduceOp::kSum, root);
  return detail::dispatch(g, async, op::kScatter, base, call, {send, recv},
                          [=](OpContext& ctx) {
                            const size_t block = count * elementSize(type);
                            std::vector<transport::Transfer> batch;
                            if (ctx.rank() == root) {
                              const auto* in = static_cast<const uint8_t*>(send);
                              if (block > 0) std::memmove(recv, in + root * block, block);
                              for (int p = 0; p < ctx.size(); ++p) {
                                if (p != root)
                                  batch.push_back(ctx.send(p, 0, in + p * block, block));
                              }
                            } else {
                              batch.push_back(ctx.recv(root, 0, recv, block));
                            }
                            ctx.run(batch);
                          });
}

}  // namespace

void scatter(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
             const CallOptions& call) {
  scatterImpl(g, false, send, recv, count, type, root, call);
}

std::shared_ptr<Work> scatterAsync(Group& g, const void* send, void* recv, size_t count,
                                   DataType type, int root, const CallOptions& call) {
  return scatterImpl(g, true, send, recv, count, type, root, call);
}

}  // namespace shoal::comm
