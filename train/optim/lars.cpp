#include "train/optim/lars.h"

#include <cmath>

#include "common/error.h"

namespace shoal::train {

void LarsOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eta);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exclude_one_dim);
}

void LarsOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eta);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, exclude_one_dim);
}

void LarsParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void LarsParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

Lars::Lars(std::vector<torch::optim::OptimizerParamGroup> groups, LarsOptions defaults,
           LayerMap map)
    : Optimizer(std::move(groups), std::make_unique<LarsOptions>(defaults)), map_(std::move(map)) {
  SHOAL_CHECK(defaults.lr() >= 0 && defaults.momentum() >= 0 && defaults.momentum() < 1 &&
                  defaults.eta() > 0 && defaults.eps() >= 0 && defaults.weight_decay() >= 0,
              "lars: lr {}, momentum {}, eta {}, eps {}, weight decay {}", defaults.lr(),
              defaults.momentum(), defaults.eta(), defaults.eps(), defaults.weight_decay());
  std::vector<torch::Tensor> tensors;
  for (const auto& p : flatParams(param_groups_)) tensors.push_back(p.tensor);
  resolveLayers(map_, tensors);
}

torch::Tensor Lars::step(LossClosure closure) {
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
  auto options = [&](const LayerSegment& seg) -> const LarsOptions& {
    return static_cast<const LarsOptions&>(param_groups_[params[seg.tensor].group].options());
  };
  auto excluded = [&](const LayerSegment& seg) {
    return options(seg).exclude_one_dim() && layers.oneDim[seg.layer];
  };

  // This process's part of each layer's weight and gradient norms.
  std::vector<double> sums(2 * numLayers, 0.0);
  for (const auto& seg : layers.segments) {
    const auto& p = params[seg.tensor].tensor;
    if (!p.grad().defined() || excluded(seg)) continue;  // excluded: local rate 1, norms unused
    sums[seg.layer] += segmentOf(p, seg).square().sum(torch::kFloat64).item<double>();
    sums[numLayers + seg.layer] +=
        segmentOf(p.grad().contiguous(), seg).square().sum(torch::kFloat64).item<double>();
  }
  if (map_.sumAcrossShards) {
    map_.sumAcrossShards(sums);
    SHOAL_CHECK_EQ(sums.size(), 2 * numLayers, "lars: sumAcrossShards changed the length");
  }

  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i].tensor;
    const auto& o = static_cast<const LarsOptions&>(param_groups_[params[i].group].options());
    if (!p.grad().defined() || o.momentum() == 0) continue;
    auto& slot = state_[c10::guts::to_string(p.unsafeGetTensorImpl())];
    if (!slot) {
      auto fresh = std::make_unique<LarsParamState>();
      fresh->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
  }
  for (const auto& seg : layers.segments) {
    const auto& p = params[seg.tensor].tensor;
    if (!p.grad().defined()) continue;
    const auto& o = options(seg);
    double localLr = 1;
    double decay = 0;
    if (!excluded(seg)) {
      decay = o.weight_decay();
      const double wNorm = std::sqrt(sums[seg.layer]);
      const double gNorm = std::sqrt(sums[numLayers + seg.layer]);
      if (wNorm > 0 && gNorm > 0) localLr = o.eta() * wNorm / (gNorm + decay * wNorm + o.eps());
    }
    auto w = segmentOf(p, seg);
    auto d = segmentOf(p.grad().contiguous(), seg).clone();
    if (decay != 0) d.add_(w, decay);
    const double rate = o.lr() * localLr;
    if (o.momentum() == 0) {
      w.add_(d, -rate);
      continue;
    }
    auto& s = static_cast<LarsParamState&>(*state_[c10::guts::to_string(p.unsafeGetTensorImpl())]);
    auto v = segmentOf(s.momentum_buffer(), seg);
    v.mul_(o.momentum()).add_(d, rate);
    w.sub_(v);
  }
  return loss;
}

void Lars::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

void Lars::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

}  // namespace shoal::train
