// A linear layer split by output features over the tensor-parallel ranks (Megatron-LM's
// ColumnParallelLinear): rank r keeps rows [slice r] of the weight and bias, computes its slice
// of the output, and (gatherOutput) all-gathers the full output or leaves it split for a
// row-parallel layer or a vocabulary-parallel loss. Its input enters through copyToRegion
// (train/tensor/regions.h): identity forward, all-reduce of the input gradient backward.
//
// The output features may be `blocks` equal blocks (e.g. 3 for fused query/key/value): each
// block is sliced on its own, so rank r holds its heads' queries, keys and values. Slices need
// not be equal (sliceOf) unless the output is gathered. Built from the full weight, which every
// rank makes the same way (same seed), so the parallel layer computes what the one-process layer
// would.
//
// Contract: forward and backward are collective over tg.group (see regions.h); one training
// thread. InvalidArgument for shapes that do not fit (named).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "train/tensor/parallel_layer.h"
#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

struct ColumnOptions {
  bool gatherOutput = false;
  int blocks = 1;
  // Off when the caller already passed the input through copyToRegion (several column layers
  // reading one input would otherwise all-reduce its gradient once each).
  bool copyInput = true;
};

class ColumnParallelLinearImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // fullWeight [out, in]; fullBias [out] or undefined (no bias).
  ColumnParallelLinearImpl(const torch::Tensor& fullWeight, const torch::Tensor& fullBias,
                           TensorGroup tg, ColumnOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<std::pair<std::string, torch::Tensor>> gatherFull() const override;
  // Weight and bias: rows of each block.
  bool sliced(std::string_view) const override { return true; }

  // This rank's slice of each block of the output features.
  Slice blockSlice() const { return slice_; }
  const TensorGroup& group() const { return tg_; }

  torch::Tensor weight;  // [blocks * slice, in]
  torch::Tensor bias;    // [blocks * slice] or undefined

 private:
  TensorGroup tg_;
  ColumnOptions options_;
  int64_t blockSize_ = 0;  // full output features per block
  Slice slice_;
};
TORCH_MODULE(ColumnParallelLinear);

// Rows [slice] of each of `blocks` equal blocks of dimension 0 of `full`, concatenated.
torch::Tensor sliceBlocks(const torch::Tensor& full, int blocks, const Slice& slice);

}  // namespace shoal::train::tensor
