// A linear layer split by input features over the tensor-parallel ranks (Megatron-LM's
// RowParallelLinear): rank r keeps columns [slice r] of the weight, multiplies its slice of the
// input, and the partial outputs are summed by reduceFromRegion (all-reduce forward, identity
// backward); the bias, kept whole on every rank, is added once after the sum. The input is
// either already split (the output of a column-parallel layer) or split here (scatterToRegion).
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

struct RowOptions {
  bool inputIsParallel = true;
};

class RowParallelLinearImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // fullWeight [out, in]; fullBias [out] or undefined.
  RowParallelLinearImpl(const torch::Tensor& fullWeight, const torch::Tensor& fullBias,
                        TensorGroup tg, RowOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<std::pair<std::string, torch::Tensor>> gatherFull() const override;
  // The bias is whole on every rank.
  bool sliced(std::string_view name) const override { return name == "weight"; }

  torch::Tensor weight;  // [out, slice]
  torch::Tensor bias;    // [out] or undefined

 private:
  TensorGroup tg_;
  RowOptions options_;
  int64_t inFeatures_ = 0;
};
TORCH_MODULE(RowParallelLinear);

}  // namespace shoal::train::tensor
