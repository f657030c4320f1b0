// Dropout for an activation split over the tensor-parallel ranks (the output of a
// column-parallel layer left split for a row-parallel one: Megatron's MLP and attention heads).
//
// Why not torch::nn::Dropout: the Trainer gives a stage's tensor ranks one shared random stream
// (train/trainer.cpp), so that dropout on an activation every rank holds whole draws the same
// mask everywhere and the copies stay equal. On a split activation that same stream draws the
// same mask for every rank's slice: slice 1's element i is dropped exactly when slice 0's is,
// so the one-process model's mask is the slice mask repeated, not independent. Megatron-LM
// solves this with a second, per-tensor-rank generator for the split regions; here each call
// takes one 64-bit draw from the shared stream (so the ranks' shared streams stay in step) and
// mixes the tensor rank into it to seed this call's own generator: every rank a different mask,
// every call a fresh one, and a replay of the shared stream (activation checkpointing's
// recomputation) the same masks again.
//
// Contract: no communication; one training thread (it draws from libtorch's default CPU
// generator under its lock). The mask is drawn on the CPU and moved to the input's device.
// Identity in evaluation mode or with p = 0. InvalidArgument for p outside [0, 1).
#pragma once

#include <torch/torch.h>

#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

class ShardedDropoutImpl : public torch::nn::Module {
 public:
  ShardedDropoutImpl(double p, TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double p_;
  TensorGroup tg_;
};
TORCH_MODULE(ShardedDropout);

}  // namespace shoal::train::tensor
