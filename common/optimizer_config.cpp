#include "common/optimizer_config.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace shoal {

OptimizerKind parseOptimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "rmsprop") return OptimizerKind::kRmsprop;
  if (name == "lamb") return OptimizerKind::kLamb;
  if (name == "lars") return OptimizerKind::kLars;
  if (name == "adamw") return OptimizerKind::kAdamW;
  SHOAL_THROW(InvalidArgument, "optimizer '{}': expected sgd, adam, adamw, rmsprop, lamb or lars",
              name);
}

std::string_view toString(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kRmsprop:
      return "rmsprop";
    case OptimizerKind::kLamb:
      return "lamb";
    case OptimizerKind::kLars:
      return "lars";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "invalid";
}

LrSchedule::LrSchedule(double baseLr, int workers, bool linearScaling, int64_t warmupSteps,
                       int64_t totalSteps)
    : base_(baseLr),
      target_(linearScaling ? baseLr * workers : baseLr),
      scaled_(linearScaling),
      warmup_(warmupSteps),
      total_(totalSteps) {
  SHOAL_CHECK(baseLr > 0 && workers >= 1 && warmupSteps >= 0 && totalSteps >= 0,
              "learning-rate schedule: lr {}, workers {}, warm-up {}, total {}", baseLr, workers,
              warmupSteps, totalSteps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_) {
    // Scaled: from the one-worker rate up to the scaled one. Unscaled: from nearly zero (else
    // a warm-up without scaling would do nothing).
    if (!scaled_) {
      return target_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    }
    return base_ + (target_ - base_) * static_cast<double>(step) / static_cast<double>(warmup_);
  }
  if (total_ <= warmup_) return target_;
  const double t =
      std::min(1.0, static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_));
  return target_ * 0.5 * (1.0 + std::cos(M_PI * t));
}

}  // namespace shoal
