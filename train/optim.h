// libtorch's optimizers from Shoal's optimizer settings (common/optimizer_config.h).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/optimizer_config.h"
#include "train/optim/layer_map.h"

namespace shoal::train {

// The names and settings live in common/optimizer_config.h (shared with the parameter server).
using shoal::OptimizerKind;
using shoal::OptimizerOptions;
using shoal::parseOptimizer;

// InvalidArgument for a non-positive learning rate or invalid settings. Without a layer map,
// LAMB and LARS treat every tensor as one whole layer.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& options);
// The same, with where each layer lies (train/optim/layer_map.h) for the layer-wise kinds (lamb,
// lars); sgd, adam, adamw and rmsprop are elementwise and ignore it.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& options,
                                                       LayerMap map);

// Sets every parameter group's learning rate (with shoal::LrSchedule).
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace shoal::train
