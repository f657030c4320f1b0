#include "ps/server_optimizer.h"

#include <cmath>

#include "common/error.h"

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
  const float wd = static_cast<float>(o.weightDecay);
  const float mom = static_cast<float>(o.momentum);
  const float rate = static_cast<float>(lr);
  switch (o.kind) {
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) {
        float d = g[i] * gradScale + wd * p[i];
        if (s0) {
          // libtorch starts the buffer at the first gradient; with a zero buffer it is the same.
          s0[i] = mom * s0[i] + d;
          d = s0[i];
        }
        p[i] -= rate * d;
      }
      return;
    case OptimizerKind::kAdam: {
      // Constants rounded from double once, as libtorch passes them (1 - 0.9f is not 0.1f).
      const double beta1 = 0.9, beta2 = 0.999;
      const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2), eps = 1e-8f;
      const float c1 = static_cast<float>(1 - beta1), c2 = static_cast<float>(1 - beta2);
      const double t = static_cast<double>(count);
      const float bc2sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
      const float stepSize = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
      for (size_t i = 0; i < n; ++i) {
        const float d = g[i] * gradScale + wd * p[i];
        s0[i] = s0[i] * b1 + d * c1;
        s1[i] = s1[i] * b2 + d * d * c2;
        const float denom = std::sqrt(s1[i]) / bc2sqrt + eps;
        p[i] -= stepSize * (s0[i] / denom);
      }
      return;
    }
    case OptimizerKind::kRmsprop: {
      const double alpha = 0.99;
      const float a = static_cast<float>(alpha), c = static_cast<float>(1 - alpha), eps = 1e-8f;
      for (size_t i = 0; i < n; ++i) {
        const float d = g[i] * gradScale + wd * p[i];
        s0[i] = a * s0[i] + c * d * d;
        const float avg = std::sqrt(s0[i]) + eps;
        if (s1) {
          s1[i] = mom * s1[i] + d / avg;
          p[i] -= rate * s1[i];
        } else {
          p[i] -= rate * (d / avg);
        }
      }
      return;
    }
    case OptimizerKind::kLamb:
    case OptimizerKind::kLars:
    case OptimizerKind::kAdamW:
      unsupported(o.kind);
  }
}

}  // namespace shoal::ps
