// The element-wise optimizer updates a parameter server applies to its shard (ps/server_optimizer.h
// says what they compute), compiled for the baseline and for AVX2 and chosen at run time with
// the reduction kernels (common/reduce_isa.h): the build is portable, yet a CPU with AVX2 runs
// an update vectorized for it. A 4 MiB push applied as it arrives from the ring (Note [Update
// from the ring] in ps/server_session.cpp) spent 28% of a push-pull's CPU time in the baseline
// (SSE2) loop, on the server's critical path; Adam's and RMSprop's loops were not vectorized
// at all (sqrt with errno).
//
// The set is named as common/reduce_isa.h's selected one (SHOAL_REDUCE_ISA picks one, for tests
// and measurements); "avx512" runs the AVX2 loops (ps/update_kernels.cpp says why). Every copy
// computes the same results bit for bit: each element alone, in the same order of operations,
// and no multiply-add fused into one rounding (the kernels' files are compiled with
// -ffp-contract=off; CMakeLists.txt). Thread-safe, allocation-free.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "common/optimizer_config.h"

namespace shoal::ps::update_isa {

// One update's constants, rounded to float once (as libtorch passes them).
struct Step {
  OptimizerKind kind = OptimizerKind::kSgd;  // sgd, adam or rmsprop
  float gradScale = 1, weightDecay = 0, momentum = 0, rate = 0;
  // Adam: the moments' decay rates and their complements, epsilon, and the bias corrections.
  float beta1 = 0, beta2 = 0, oneMinusBeta1 = 0, oneMinusBeta2 = 0, eps = 0;
  float bias2Sqrt = 1, stepSize = 0;
  // RMSprop: the square average's decay and its complement.
  float alpha = 0, oneMinusAlpha = 0;
};

// p, s0 and s1 are updated in place from g; s0/s1 are null when the optimizer keeps no such
// slot (ps/server_optimizer.h). The spans must not overlap each other.
using UpdateFn = void (*)(const Step& step, const float* g, float* p, float* s0, float* s1,
                          size_t n);

struct Kernels {
  std::string_view name;
  UpdateFn update;
};

// The sets this CPU runs, named as common/reduce_isa.h's ("generic" first).
std::vector<Kernels> available();
// The set named like common/reduce_isa.h's selected one.
const Kernels& selected();

#define SHOAL_UPDATE_ISA_DECLARE(isa)                                                      \
  namespace isa {                                                                          \
  void update(const Step& step, const float* g, float* p, float* s0, float* s1, size_t n); \
  }
SHOAL_UPDATE_ISA_DECLARE(generic)
SHOAL_UPDATE_ISA_DECLARE(avx2)
#undef SHOAL_UPDATE_ISA_DECLARE

}  // namespace shoal::ps::update_isa
