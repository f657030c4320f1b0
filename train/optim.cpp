#include "train/optim.h"

#include <cmath>

#include "common/error.h"

namespace shoal::train {

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

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace shoal::train
