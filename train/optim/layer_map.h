// Where each layer's elements lie among a layer-wise optimizer's tensors (LAMB, LARS), so that
// the per-layer norms those optimizers need come out the same when a layer is split over several
// flat tensors and several ranks (ZeRO shards) as when one process holds it whole.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace shoal::train {

// Elements [offset, offset + numel) of the optimizer's tensor `tensor` (its index flattened over
// the parameter groups, in order; offsets into the tensor's flattened, contiguous storage) belong
// to layer `layer`.
struct LayerSegment {
  size_t tensor = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  size_t layer = 0;
};

struct LayerMap {
  // Empty: every tensor is one whole layer (layer i is tensor i). Otherwise the segments cover
  // every element of every tensor exactly once, in any order.
  std::vector<LayerSegment> segments;
  // Per layer: the full parameter is 1-D (biases, norms), for the optimizers' excludeOneDim.
  // With segments it is required and its size is the number of layers (every shard must agree on
  // it, including layers of which it holds nothing). Without segments it may be empty: then a
  // tensor of at most one dimension is a 1-D layer.
  std::vector<bool> oneDim;
  // Sums the per-layer partial sums over every shard holding part of a layer (an all-reduce
  // across ranks), in place. Null: nothing to add (one process holds everything). Called exactly
  // once per step(), on the optimizer's thread, by every shard, with a vector of the same length
  // everywhere: every shard must step together.
  std::function<void(std::vector<double>& partialSums)> sumAcrossShards;
};

// The map resolved against the optimizer's tensors: the segments (one per tensor when the map
// has none) and the 1-D flag of each layer. InvalidArgument when the segments are out of range,
// overlap, leave elements uncovered, name a layer past oneDim, or a segmented tensor is not
// contiguous.
struct ResolvedLayers {
  std::vector<LayerSegment> segments;
  std::vector<bool> oneDim;
  size_t layers() const { return oneDim.size(); }
};
ResolvedLayers resolveLayers(const LayerMap& map, const std::vector<torch::Tensor>& tensors);

// The optimizer's tensors flattened over its parameter groups, with the index of each one's
// group, in the order LayerSegment::tensor counts them.
struct FlatParam {
  torch::Tensor tensor;
  size_t group = 0;
};
std::vector<FlatParam> flatParams(const std::vector<torch::optim::OptimizerParamGroup>& groups);

// The segment's elements of t, a view (t itself when the segment is the whole tensor, so that a
// non-contiguous parameter works without a layer map).
torch::Tensor segmentOf(const torch::Tensor& t, const LayerSegment& seg);

}  // namespace shoal::train
