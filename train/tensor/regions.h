// The four conjugate collectives at the edges of a tensor-parallel region (Megatron-LM's f and g),
// as autograd functions: each is one collective in one direction and its conjugate in the other,
// so a column-parallel layer followed by a row-parallel one costs one all-reduce in forward and
// one in backward.
//
//   copyToRegion       forward: identity                  backward: all-reduce (sum)
//   reduceFromRegion   forward: all-reduce (sum)          backward: identity
//   gatherFromRegion   forward: all-gather along the last dimension   backward: own slice
//   scatterToRegion    forward: own slice of the last dimension       backward: all-gather
//
// Contract: collective over tg.group (every rank calls the same functions on tensors of the same
// shape, in the same order, forward and backward); blocking, bounded by the group's timeout;
// failures are the group's (comm/group.h: PeerError / TimeoutError naming the failed rank). With
// no parallelism (tg.size() == 1) each is the identity and moves nothing. The gather and scatter
// need the last dimension divisible by the group size (InvalidArgument otherwise). Tensors of any
// floating type Shoal can reduce (float, double, bf16, fp16: the engine accumulates in float).
// The TensorGroup is held by the autograd graph until backward ran.
#pragma once

#include <torch/torch.h>

#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

torch::Tensor copyToRegion(const torch::Tensor& x, const TensorGroup& tg);
torch::Tensor reduceFromRegion(const torch::Tensor& x, const TensorGroup& tg);
torch::Tensor gatherFromRegion(const torch::Tensor& x, const TensorGroup& tg);
torch::Tensor scatterToRegion(const torch::Tensor& x, const TensorGroup& tg);

// Plain (not differentiated) collectives on a tensor over the group, counted as forward traffic:
// in-place sum or max, and all-gather along the last dimension of slices of possibly unequal
// sizes (`sizes[r]` is rank r's; each is padded to the largest for the exchange).
void allreduceInPlace(torch::Tensor& t, const TensorGroup& tg, ReduceOp op = ReduceOp::kSum);
torch::Tensor allgatherLastDim(const torch::Tensor& x, const TensorGroup& tg,
                               const std::vector<int64_t>& sizes);

}  // namespace shoal::train::tensor
