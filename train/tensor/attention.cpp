#include "train/tensor/attention.h"

#include <cmath>

#include "common/error.h"
#include "train/process_grid.h"

namespace shoal::train::tensor {

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(const AttentionWeights& full, int64_t heads,
                                                     TensorGroup tg) {
  const int64_t hidden = full.projWeight.size(0);
  if (heads < 1 || hidden % heads != 0) {
    SHOAL_THROW(InvalidArgument, "attention: {} heads do not divide hidden size {}", heads, hidden);
  }
  requireDivisible("attention heads", heads, "tensor", tg.size());
  localHeads_ = heads / tg.size();
  headDim_ = hidden / heads;
  qkv = register_module(
      "qkv", ColumnParallelLinear(full.qkvWeight, full.qkvBias, tg, ColumnOptions{.blocks = 3}));
  proj = register_module("proj", RowParallelLinear(full.projWeight, full.projBias, tg));
}

torch::Tensor ParallelSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1);
  // [b, s, 3 * localHeads * headDim] -> three [b, localHeads, s, headDim]
  auto parts = qkv->forward(x).view({b, s, 3, localHeads_, headDim_}).permute({2, 0, 3, 1, 4});
  torch::Tensor q = parts[0], k = parts[1], v = parts[2];
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(headDim_));
  torch::Tensor future = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor attn = torch::softmax(scores, -1);
  torch::Tensor out =
      torch::matmul(attn, v).transpose(1, 2).reshape({b, s, localHeads_ * headDim_});
  return proj->forward(out);
}

}  // namespace shoal::train::tensor
