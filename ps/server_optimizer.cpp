#include "ps/server_optimizer.h"

#include <cmath>

#include "common/error.h"
#include "ps/update_kernels.h"

namespace shoal::ps {

namespace {

// TrainingConfig::validate rejects these kinds first; this guards direct callers.
[[noreturn]] void unsupported(OptimizerKind kind) {
  SHOAL_THROW(InvalidArgument,
              "the parameter server does not support {} (use sgd, adam or rmsprop)",
              toString(kind));
}

}  // namespace

int optimizerStateSlots(const OptimizerOptions& o) {
  switch (o.kind) {
    case OptimizerKind::kSgd:
      return o.momentum != 0 ? 1 : 0;
    case OptimizerKind::kAdam:
      return 2;
    case OptimizerKind::kRmsprop:
      return o.momentum != 0 ? 2 : 1;
    case OptimizerKind::kLamb:
    case OptimizerKind::kLars:
    case OptimizerKind::kAdamW:
      unsupported(o.kind);
  }
  return 0;
}

void applyUpdate(const OptimizerOptions& o, double lr, int64_t count, float gradScale,
                 const float* g, float* p, float* s0, float* s1, size_t n) {
  update_isa::Step s;
  s.kind = o.kind;
  s.gradScale = gradScale;
  s.weightDecay = static_cast<float>(o.weightDecay);
  s.momentum = static_cast<float>(o.momentum);
  s.rate = static_cast<float>(lr);
  switch (o.kind) {
    case OptimizerKind::kSgd:
      break;
    case OptimizerKind::kAdam: {
      // Constants rounded from double once, as libtorch passes them (1 - 0.9f is not 0.1f).
      const double beta1 = 0.9, beta2 = 0.999;
      s.beta1 = static_cast<float>(beta1);
      s.beta2 = static_cast<float>(beta2);
      s.oneMinusBeta1 = static_cast<float>(1 - beta1);
      s.oneMinusBeta2 = static_cast<float>(1 - beta2);
      s.eps = 1e-8f;
      const double t = static_cast<double>(count);
      s.bias2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
      s.stepSize = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
      break;
    }
    case OptimizerKind::kRmsprop: {
      const double alpha = 0.99;
      s.alpha = static_cast<float>(alpha);
      s.oneMinusAlpha = static_cast<float>(1 - alpha);
      s.eps = 1e-8f;
      break;
    }
    case OptimizerKind::kLamb:
    case OptimizerKind::kLars:
    case OptimizerKind::kAdamW:
      unsupported(o.kind);
  }
  update_isa::selected().update(s, g, p, s0, s1, n);
}

}  // namespace shoal::ps
