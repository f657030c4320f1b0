// Reduce to `root` along a binomial tree: each rank reduces what its children send (all
// children at once, reduced as bytes arrive) into a scratch copy of its own buffer, then sends
// the partial result to its parent. The root reduces straight into its buffer; the other
// ranks' buffers are left as they were. An average is divided by the root's last receive,
// from its largest subtree, taken after the others (Note [Average in the last step] in
// algorithms.h).
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

void reduce(OpContext& ctx, const Operation& op) {
  const size_t total = op.count * elementSize(op.type);
  const auto tree = binomialTree(ctx.rank(), op.root, ctx.size());
  std::vector<uint8_t> scratch;
  void* acc = op.recv;
  if (tree.parent >= 0) {
    scratch.assign(static_cast<uint8_t*>(op.recv), static_cast<uint8_t*>(op.recv) + total);
    acc = scratch.data();
  }
  std::vector<transport::Transfer> batch;
  const auto& children = tree.children;
  // An average's root takes its largest subtree (children[0], which also finishes last) after
  // the others, so that this reduction completes every element and divides in the same pass
  // (Note [Average in the last step] in algorithms.h).
  const bool lastApart = op.redop == ReduceOp::kAvg && tree.parent < 0 && !children.empty();
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
}

}  // namespace shoal::comm::algo
