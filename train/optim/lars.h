// LARS (You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks"):
// momentum SGD whose rate is scaled per layer by a local rate, the ratio of the layer's weight
// norm to its gradient norm.
//
// For each parameter w with gradient g:
//   local_lr = eta ||w|| / (||g|| + weight_decay ||w|| + eps) over the layer
//              (1 when ||w|| or ||g|| is 0)
//   v = momentum v + lr local_lr (g + weight_decay w)        (v starts at zero)
//   w -= v
// The norms are the layer's (see train/optim/layer_map.h for layers split over tensors and
// shards). eps is not in the paper (default 0; the rule for zero norms already avoids dividing
// by zero). With exclude_one_dim (default), layers whose parameter is 1-D (biases, norms) get
// local_lr = 1 and no weight decay, as is common practice.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "train/optim/layer_map.h"

namespace shoal::train {

struct LarsOptions : public torch::optim::OptimizerCloneableOptions<LarsOptions> {
  LarsOptions(double lr = 0.1) : lr_(lr) {}
  TORCH_ARG(double, lr) = 0.1;
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, eta) = 0.001;  // the trust coefficient
  TORCH_ARG(double, eps) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, exclude_one_dim) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct LarsParamState : public torch::optim::OptimizerCloneableParamState<LarsParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);  // undefined while momentum is 0

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// Not thread-safe (like libtorch's optimizers). step() calls map.sumAcrossShards exactly once,
// with [||w||^2 of every layer..., ||g||^2 of every layer...] as this process's partial sums,
// and throws what it throws. Tensors without a gradient are skipped (not updated, no part of any
// norm). InvalidArgument for invalid options, or for a map that does not fit the parameters
// (see resolveLayers; checked at construction and at every step).
class Lars : public torch::optim::Optimizer {
 public:
  explicit Lars(std::vector<torch::optim::OptimizerParamGroup> groups, LarsOptions defaults = {},
                LayerMap map = {});
  explicit Lars(std::vector<torch::Tensor> params, LarsOptions defaults = {}, LayerMap map = {})
      : Lars({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults),
             std::move(map)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  LayerMap map_;
};

}  // namespace shoal::train
