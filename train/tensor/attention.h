// Causal multi-head self-attention with its heads split over the tensor-parallel ranks
// (Megatron-LM's ParallelAttention): the fused query/key/value projection is column-parallel
// (each rank holds its heads' queries, keys and values), attention runs on local heads only,
// and the output projection is row-parallel. One all-reduce forward (after the output
// projection) and one backward (the input's gradient, at the query/key/value projection).
//
// Contract: forward and backward are collective over tg.group (see regions.h); one training
// thread. Input and output [batch, sequence, hidden]. InvalidArgument, before anything moves,
// when heads do not divide hidden or the tensor-parallel ranks do not divide heads.
#pragma once

#include <torch/torch.h>

#include "train/tensor/column_linear.h"
#include "train/tensor/row_linear.h"
#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

struct AttentionWeights {
  torch::Tensor qkvWeight;   // [3 * hidden, hidden]: queries, keys, values (heads in order)
  torch::Tensor qkvBias;     // [3 * hidden]
  torch::Tensor projWeight;  // [hidden, hidden]
  torch::Tensor projBias;    // [hidden]
};

class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  ParallelSelfAttentionImpl(const AttentionWeights& full, int64_t heads, TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear qkv = nullptr;
  RowParallelLinear proj = nullptr;

 private:
  int64_t localHeads_ = 0;
  int64_t headDim_ = 0;
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace shoal::train::tensor
