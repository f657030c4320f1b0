// Optimizer settings and the large-batch learning-rate rules, framework-neutral so that
// data-parallel training (train/, libtorch's optimizers) and parameter servers (ps/, their own
// kernels) read the same flags: linear scaling with the number of workers and a linear warm-up
// (Goyal et al., "Accurate, Large Minibatch SGD"), then optional cosine decay.
#pragma once

#include <cstdint>
#include <string_view>

namespace shoal {

// kLamb and kLars are layer-wise (train/optim/lamb.h, lars.h): data-parallel training only, the
// parameter server's elementwise kernels do not apply them. kAdamW is Adam with decoupled weight
// decay (Loshchilov and Hutter: each step shrinks the weights by lr x weightDecay instead of
// adding weightDecay x weight to the gradient, libtorch's AdamW); the parameter server's kernels
// do not implement it either.
enum class OptimizerKind { kSgd, kAdam, kRmsprop, kLamb, kLars, kAdamW };
// sgd | adam | rmsprop | lamb | lars | adamw
OptimizerKind parseOptimizer(std::string_view name);
std::string_view toString(OptimizerKind kind);

// Hyper-parameters follow libtorch's defaults and formulas (Adam betas 0.9/0.999, eps 1e-8;
// RMSprop alpha 0.99, eps 1e-8), and the papers' for LAMB (betas 0.9/0.999, eps 1e-6) and LARS
// (eta 0.001, momentum 0.9).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double momentum = 0.9;  // SGD's, RMSprop's and LARS's
  double weightDecay = 0;
  double eta = 0.001;         // LARS's trust coefficient
  bool excludeOneDim = true;  // LAMB, LARS: 1-D layers get ratio 1 and no weight decay
};

class LrSchedule {
 public:
  // The rate at a step: baseLr (x workers with linear scaling), reached linearly over
  // warmupSteps starting from baseLr (the one-worker rate) with scaling, or from
  // baseLr / warmupSteps without (train::Trainer's schedule is the same), then, with
  // totalSteps > 0, a cosine decay to zero at totalSteps. InvalidArgument for a non-positive
  // rate or negative steps.
  LrSchedule(double baseLr, int workers, bool linearScaling, int64_t warmupSteps,
             int64_t totalSteps = 0);
  double at(int64_t step) const;
  double target() const { return target_; }

 private:
  double base_;
  double target_;
  bool scaled_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace shoal
