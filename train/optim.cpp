#include "train/optim.h"

#include <cmath>

#include "common/error.h"
#include "train/optim/lamb.h"
#include "train/optim/lars.h"

namespace shoal::train {

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& o) {
  return makeOptimizer(std::move(params), o, LayerMap{});
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& o, LayerMap map) {
  SHOAL_CHECK(o.lr > 0, "learning rate {} must be positive", o.lr);
  switch (o.kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weightDecay));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(o.lr).weight_decay(o.weightDecay));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weightDecay));
    case OptimizerKind::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params,
          torch::optim::RMSpropOptions(o.lr).momentum(o.momentum).weight_decay(o.weightDecay));
    case OptimizerKind::kLamb:
      return std::make_unique<Lamb>(
          std::move(params),
          LambOptions(o.lr).weight_decay(o.weightDecay).exclude_one_dim(o.excludeOneDim),
          std::move(map));
    case OptimizerKind::kLars:
      return std::make_unique<Lars>(std::move(params),
                                    LarsOptions(o.lr)
                                        .momentum(o.momentum)
                                        .eta(o.eta)
                                        .weight_decay(o.weightDecay)
                                        .exclude_one_dim(o.excludeOneDim),
                                    std::move(map));
  }
  SHOAL_THROW(InvalidArgument, "unknown optimizer");
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace shoal::train
