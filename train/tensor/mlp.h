// The transformer's feed-forward block as a column-parallel -> GELU -> row-parallel pair
// (Megatron-LM's ParallelMLP): the hidden activations stay split, so the pair costs one
// all-reduce forward (after the second layer) and one backward (the input's gradient).
//
// Contract: forward and backward are collective over tg.group (see regions.h); one training
// thread. InvalidArgument when the tensor-parallel ranks do not divide the inner size.
#pragma once

#include <torch/torch.h>

#include "train/tensor/column_linear.h"
#include "train/tensor/row_linear.h"
#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

struct MlpWeights {
  torch::Tensor fc1Weight;  // [inner, hidden]
  torch::Tensor fc1Bias;    // [inner]
  torch::Tensor fc2Weight;  // [hidden, inner]
  torch::Tensor fc2Bias;    // [hidden]
};

class ParallelMlpImpl : public torch::nn::Module {
 public:
  ParallelMlpImpl(const MlpWeights& full, TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear fc1 = nullptr;
  RowParallelLinear fc2 = nullptr;
};
TORCH_MODULE(ParallelMlp);

}  // namespace shoal::train::tensor
