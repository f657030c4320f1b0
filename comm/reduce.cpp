// Reduce to `root` along a binomial tree: each rank reduces what its children send (all
// children at once, reduced as bytes arrive) into a scratch copy of its own buffer, then sends
// the partial result to its parent. The root reduces straight into its buffer; the other
// ranks' buffers are left as they were. An average is divided by the root's last receive,
// from its largest subtree, taken after the others (Note [Average in the last step] in
// comm/algorithms.h).
#include <cstring>

#include "comm/algorithms.h"
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

std::shared_ptr<Work> reduceImpl(Group& g, bool async, void* data, size_t count, DataType type,
                                 ReduceOp op, int root, const CallOptions& call) {
  detail::checkBuffer(g, data, count, type, "reduce");
  detail::checkRoot(g, root, "reduce");
  detail::checkReduceOp(op);
  auto base = detail::baseHeader(count, type, op, root);
  return detail::dispatch(
      g, async, op::kReduce, base, call, {.recv = data}, [=](OpContext& ctx) {
        const size_t total = count * elementSize(type);
        const auto tree = algo::binomialTree(ctx.rank(), root, ctx.size());
        std::vector<uint8_t> scratch;
        void* acc = data;
        if (tree.parent >= 0) {
          scratch.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + total);
          acc = scratch.data();
        }
        std::vector<transport::Transfer> batch;
        const auto& children = tree.children;
        // An average's root takes its largest subtree (children[0], which also finishes
        // last) after the others, so that this reduction completes every element and divides
        // in the same pass (Note [Average in the last step] in comm/algorithms.h).
        const bool lastApart = op == ReduceOp::kAvg && tree.parent < 0 && !children.empty();
        for (size_t c = lastApart ? 1 : 0; c < children.size(); ++c) {
          batch.push_back(ctx.recvReduce(children[c], 0, acc, total));
        }
        ctx.run(batch);
        if (lastApart) {
          batch.clear();
          batch.push_back(ctx.recvReduceFinal(children[0], 0, acc, total));
          ctx.run(batch);
        }
        if (tree.parent >= 0) {
          batch.clear();
          batch.push_back(ctx.send(tree.parent, 0, acc, total));
          ctx.run(batch);
        }
      });
}

}  // namespace

void reduce(Group& g, void* data, size_t count, DataType type, ReduceOp op, int root,
            const CallOptions& call) {
  reduceImpl(g, false, data, count, type, op, root, call);
}

std::shared_ptr<Work> reduceAsync(Group& g, void* data, size_t count, DataType type, ReduceOp op,
                                  int root, const CallOptions& call) {
  return reduceImpl(g, true, data, count, type, op, root, call);
}

}  // namespace shoal::comm
