// Momentum correction around the top-k and 1-bit codecs (momentum_correction.h). The velocity
// is updated in its own pass rather than inside the codecs' first pass: the codecs stay the
// plain error-feedback ones the parameter servers use, at the price of one more pass over the
// bucket per step.
#include "comm/compress/momentum_correction.h"

#include <cstring>

#include "comm/compress/sign.h"
#include "comm/compress/topk.h"

namespace shoal::compress {

void momentumUpdate(const float* grad, float* velocity, size_t n, float momentum) {
  for (size_t i = 0; i < n; ++i) velocity[i] = momentum * velocity[i] + grad[i];
}

void topkEncodeWithMomentum(const float* grad, float* velocity, float* accumulation, size_t n,
                            size_t k, float momentum, uint8_t* message) {
  momentumUpdate(grad, velocity, n, momentum);
  topkEncode(velocity, accumulation, n, k, message);
  // Momentum-factor masking: the sent elements' accumulation is zero now (topkEncode), and
  // their velocity goes with it. The indices are our own message's, in range by construction.
  for (size_t j = 0; j < k; ++j) {
    uint32_t index;
    std::memcpy(&index, message + j * sizeof(uint32_t), sizeof(index));
    velocity[index] = 0;
  }
}

void signEncodeWithMomentum(const float* grad, float* velocity, float* accumulation, size_t n,
                            float momentum, uint8_t* message) {
  momentumUpdate(grad, velocity, n, momentum);
  signEncode(velocity, accumulation, n, message);
}

}  // namespace shoal::compress
