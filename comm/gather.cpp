// Gather to `root`, direct: every rank sends its block to the root, which receives from all of
// them at once into their places. n-1 messages through the root's links, one hop each.
#include <cstring>

#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> gatherImpl(Group& g, bool async, const void* send, void* recv, size_t count,
                                 DataType type, int root, const CallOptions& call) {
  detail::checkBuffer(g, send, count, type, "gather");
  detail::checkRoot(g, root, "gather");
  if (g.rank() == root) detail::checkBuffer(g, recv, count, type, "gather");
  auto base = detail::baseHeader(count, type, ReduceOp::kSum, root);
  return detail::dispatch(g, async, op::kGather, base, call, {send, recv},
                          [=](OpContext& ctx) {
                            const size_t block = count * elementSize(type);
                            std::vector<transport::Transfer> batch;
                            if (ctx.rank() == root) {
                              auto* out = static_cast<uint8_t*>(recv);
                              if (block > 0) std::memmove(out + root * block, send, block);
                              for (int p = 0; p < ctx.size(); ++p) {
                                if (p != root)
                                  batch.push_back(ctx.recv(p, 0, out + p * block, block));
                              }
                            } else {
                              batch.push_back(ctx.send(root, 0, send, block));
                            }
                            ctx.run(batch);
                          });
}

}  // namespace

void gather(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
            const CallOptions& call) {
  gatherImpl(g, false, send, recv, count, type, root, call);
}

std::shared_ptr<Work> gatherAsync(Group& g, const void* send, void* recv, size_t count,
                                  DataType type, int root, const CallOptions& call) {
  return gatherImpl(g, true, send, recv, count, type, root, call);
}

}  // namespace shoal::comm
