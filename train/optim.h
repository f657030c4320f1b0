// Optimizers (libtorch's) by name, and the large-batch learning-rate rules: linear scaling with
// the world size and a linear warm-up (Goyal et al., "Accurate, Large Minibatch SGD").
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::train {

enum class OptimizerKind { kSgd, kAdam, kRmsprop };
OptimizerKind parseOptimizer(std::string_view name);  // sgd | adam | rmsprop
std::string_view toString(OptimizerKind kind);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double momentum = 0.9;  // SGD's and RMSprop's
  double weightDecay = 0;
};

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimizerOptions& options);

// The learning rate at a step: baseLr (x worldSize with linear scaling), reached linearly over
// warmupSteps starting from baseLr (Goyal et al.'s warm-up from the one-worker rate), then,
// with totalSteps > 0, a cosine decay to zero at totalSteps. A scheduler object: set() applies
// it to every parameter group.
class LrSchedule {
 public:
  LrSchedule(double baseLr, int worldSize, bool linearScaling, int64_t warmupSteps,
             int64_t totalSteps = 0);
  double at(int64_t step) const;
  void set(torch::optim::Optimizer& optimizer, int64_t step) const;
  double target() const { return target_; }

 private:
  double base_;
  double target_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace shoal::train
