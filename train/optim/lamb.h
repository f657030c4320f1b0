// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
// minutes"): Adam's moments, scaled per layer by a trust ratio so that no layer's step is large
// relative to its weights.
//
// For each parameter w with gradient g, at step t (1-based):
//   m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
//   u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay w
//   r = ||w|| / ||u|| over the layer (1 when either norm is 0)
//   w -= lr r u
// The norms are the layer's (see train/optim/layer_map.h for layers split over tensors and
// shards); the paper's scaling function phi is the identity. With exclude_one_dim (default),
// layers whose parameter is 1-D (biases, norms) get r = 1 and no weight decay, as is common
// practice (BERT's and most LAMB implementations).
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <vector>

#include "train/optim/layer_map.h"

namespace shoal::train {

struct LambOptions : public torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, exclude_one_dim) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct LambParamState : public torch::optim::OptimizerCloneableParamState<LambParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// Not thread-safe (like libtorch's optimizers). step() calls map.sumAcrossShards exactly once,
// with [||w||^2 of every layer..., ||u||^2 of every layer...] as this process's partial sums,
// and throws what it throws. Tensors without a gradient are skipped (not updated, no part of any
// norm). InvalidArgument for invalid options, or for a map that does not fit the parameters
// (see resolveLayers; checked at construction and at every step).
class Lamb : public torch::optim::Optimizer {
 public:
  explicit Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults = {},
                LayerMap map = {});
  explicit Lamb(std::vector<torch::Tensor> params, LambOptions defaults = {}, LayerMap map = {})
      : Lamb({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults),
             std::move(map)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  LayerMap map_;
};

}  // namespace shoal::train
