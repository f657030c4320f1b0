#include "train/optim.h"

#include <cmath>

#include "common/error.h"

namespace shoal::train {

OptimizerKind parseOptimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "rmsprop") return OptimizerKind::kRmsprop;
  SHOAL_THROW(InvalidArgument, "optimizer '{}': expected sgd, adam or rmsprop", name);
}

std::string_view toString(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kRmsprop:
      return "rmsprop";
  }
  return "invalid";
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& o) {
  SHOAL_CHECK(o.lr > 0, "learning rate {} must be positive", o.lr);
  switch (o.kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weightDecay));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(o.lr).weight_decay(o.weightDecay));
    case OptimizerKind::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params,
          torch::optim::RMSpropOptions(o.lr).momentum(o.momentum).weight_decay(o.weightDecay));
  }
  SHOAL_THROW(InvalidArgument, "unknown optimizer");
}

LrSchedule::LrSchedule(double baseLr, int worldSize, bool linearScaling, int64_t warmupSteps,
                       int64_t totalSteps)
    : base_(baseLr),
      target_(linearScaling ? baseLr * worldSize : baseLr),
      warmup_(warmupSteps),
      total_(totalSteps) {
  SHOAL_CHECK(baseLr > 0 && worldSize >= 1 && warmupSteps >= 0,
              "learning-rate schedule: lr {}, world {}, warm-up {}", baseLr, worldSize,
              warmupSteps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_) {
    return base_ + (target_ - base_) * static_cast<double>(step) / static_cast<double>(warmup_);
  }
  if (total_ <= warmup_) return target_;
  const double t =
      std::min(1.0, static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_));
  return target_ * 0.5 * (1.0 + std::cos(M_PI * t));
}

void LrSchedule::set(torch::optim::Optimizer& optimizer, int64_t step) const {
  const double lr = at(step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace shoal::train
