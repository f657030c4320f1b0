// Internal: the algorithm entry points the collectives dispatch to. Each runs inside an
// OpContext (issue order, deadline, framing) and is defined in its own file.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/group.h"

namespace shoal::comm::algo {

// Elements of block i when `count` elements are split over n blocks as evenly as possible.
inline size_t blockBegin(size_t count, int n, int i) {
  return count / n * i + std::min<size_t>(static_cast<size_t>(i), count % n);
}
inline size_t blockSize(size_t count, int n, int i) {
  return blockBegin(count, n, i + 1) - blockBegin(count, n, i);
}

void allreduceRing(OpContext& ctx, void* data, size_t count);
void allreduceRecursiveDoubling(OpContext& ctx, void* data, size_t count);
void allreduceDriver(OpContext& ctx, void* data, size_t count);

}  // namespace shoal::comm::algo

namespace shoal::comm::algo {

// Position of `rank` in a binomial tree rooted at `root` over n ranks: its parent (-1 for the
// root) and its children, largest subtree first.
struct TreePosition {
  int parent = -1;
  std::vector<int> children;
};
TreePosition binomialTree(int rank, int root, int n);

}  // namespace shoal::comm::algo
