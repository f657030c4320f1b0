#include "train/optim/lamb.h"

#include <cmath>

#include "common/error.h"

namespace shoal::train {

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exclude_one_dim);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, exclude_one_dim);
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults,
           LayerMap map)
    : Optimizer(std::move(groups), std::make_unique<LambOptions>(defaults)), map_(std::move(map)) {
  const auto [beta1, beta2] = defaults.betas();
  SHOAL_CHECK(defaults.lr() >= 0 && defaults.eps() >= 0 && defaults.weight_decay() >= 0 &&
                  beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
              "lamb: lr {}, eps {}, weight decay {}, betas ({}, {})", defaults.lr(), defaults.eps(),
              defaults.weight_decay(), beta1, beta2);
  std::vector<torch::Tensor> tensors;
  for (const auto& p : flatParams(param_groups_)) tensors.push_back(p.tensor);
  resolveLayers(map_, tensors);
}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard noGrad;
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enableGrad(true);
    loss = closure();
  }
  const auto params = flatParams(param_groups_);
  std::vector<torch::Tensor> tensors;
  for (const auto& p : params) tensors.push_back(p.tensor);
  const ResolvedLayers layers = resolveLayers(map_, tensors);
  const size_t numLayers = layers.layers();

  // Phase 1, elementwise: the moments and the Adam direction of every tensor (no weight decay
  // yet: it depends on the layer, and a tensor may hold several).
  std::vector<torch::Tensor> update(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i].tensor;
    if (!p.grad().defined()) continue;
    const auto& o = static_cast<const LambOptions&>(param_groups_[params[i].group].options());
    auto& slot = state_[c10::guts::to_string(p.unsafeGetTensorImpl())];
    if (!slot) {
      auto fresh = std::make_unique<LambParamState>();
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
    auto& s = static_cast<LambParamState&>(*slot);
    s.step(s.step() + 1);
    const auto [beta1, beta2] = o.betas();
    const auto& g = p.grad();
    s.exp_avg().mul_(beta1).add_(g, 1 - beta1);
    s.exp_avg_sq().mul_(beta2).addcmul_(g, g, 1 - beta2);
    const double t = static_cast<double>(s.step());
    const double correction1 = 1 - std::pow(beta1, t);
    const double correction2 = 1 - std::pow(beta2, t);
    const auto denom = (s.exp_avg_sq() / correction2).sqrt_().add_(o.eps());
    update[i] = (s.exp_avg() / correction1).div_(denom);
  }

  // Phase 2, per segment: weight decay, then this process's part of each layer's two norms.
  auto excluded = [&](const LayerSegment& seg) {
    const auto& o =
        static_cast<const LambOptions&>(param_groups_[params[seg.tensor].group].options());
    return o.exclude_one_dim() && layers.oneDim[seg.layer];
  };
  std::vector<double> sums(2 * numLayers, 0.0);
  for (const auto& seg : layers.segments) {
    if (!update[seg.tensor].defined()) continue;
    const auto& o =
        static_cast<const LambOptions&>(param_groups_[params[seg.tensor].group].options());
    const auto w = segmentOf(params[seg.tensor].tensor, seg);
    auto u = segmentOf(update[seg.tensor], seg);
    if (excluded(seg)) continue;  // ratio 1: its norms are not needed
    if (o.weight_decay() != 0) u.add_(w, o.weight_decay());
    sums[seg.layer] += w.square().sum(torch::kFloat64).item<double>();
    sums[numLayers + seg.layer] += u.square().sum(torch::kFloat64).item<double>();
  }
  if (map_.sumAcrossShards) {
    map_.sumAcrossShards(sums);
    SHOAL_CHECK_EQ(sums.size(), 2 * numLayers, "lamb: sumAcrossShards changed the length");
  }

  // Phase 3: the step, scaled by the layer's trust ratio.
  for (const auto& seg : layers.segments) {
    if (!update[seg.tensor].defined()) continue;
    const auto& o =
        static_cast<const LambOptions&>(param_groups_[params[seg.tensor].group].options());
    double ratio = 1;
    if (!excluded(seg)) {
      const double wNorm = std::sqrt(sums[seg.layer]);
      const double uNorm = std::sqrt(sums[numLayers + seg.layer]);
      if (wNorm > 0 && uNorm > 0) ratio = wNorm / uNorm;
    }
    auto w = segmentOf(params[seg.tensor].tensor, seg);
    w.add_(segmentOf(update[seg.tensor], seg), -o.lr() * ratio);
  }
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

}  // namespace shoal::train
