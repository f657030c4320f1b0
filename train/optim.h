// libtorch's optimizers from Shoal's optimizer settings (common/optimizer_config.h).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/optimizer_config.h"

namespace shoal::train {

// The names and settings live in common/optimizer_config.h (shared with the parameter server).
using shoal::OptimizerKind;
using shoal::OptimizerOptions;
using shoal::parseOptimizer;

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& options);

// Sets every parameter group's learning rate (with shoal::LrSchedule).
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace shoal::train
