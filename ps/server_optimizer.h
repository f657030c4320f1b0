// The optimizer kernels a parameter server applies to its shard, on float32 spans. Formulas and
// defaults follow libtorch's SGD, Adam and RMSprop (so synchronous parameter-server training
// matches data-parallel training with libtorch's optimizers to float rounding).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/optimizer_config.h"

namespace shoal::ps {

// Only the elementwise kinds (sgd, adam, rmsprop): both calls throw InvalidArgument for lamb and
// lars, which need whole-layer norms a server's shard does not have.

// How many state floats per parameter the optimizer keeps (0, 1 or 2).
int optimizerStateSlots(const OptimizerOptions& o);

// One update of n parameters p with gradient g * gradScale at learning rate lr. `count` is the
// 1-based number of this update (Adam's bias correction). s0 and s1 are the state slots
// (momentum buffer / Adam's first and second moments / RMSprop's square average and momentum),
// zero-initialized, each n floats when used.
void applyUpdate(const OptimizerOptions& o, double lr, int64_t count, float gradScale,
                 const float* g, float* p, float* s0, float* s1, size_t n);

}  // namespace shoal::ps
