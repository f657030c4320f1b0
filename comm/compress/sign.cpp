#include "comm/compress/sign.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace shoal::compress {

namespace {

constexpr size_t kChunk = 4096;  // elements added before being summed, still in L1
constexpr size_t kLanes = 8;     // independent partial sums: the loop vectorizes

// Adds |e[i]| into lane i % kLanes (i counted from the buffer's start: kChunk is a multiple of
// kLanes), so the sum does not depend on how the buffer was cut.
void addMagnitudes(const float* e, size_t n, double* lanes) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) lanes[l] += std::fabs(static_cast<double>(e[i + l]));
  }
  for (; i < n; ++i) lanes[i % kLanes] += std::fabs(static_cast<double>(e[i]));
}

// Bits of e[first..first + count) (count <= 8) into one byte. With feedback, e is the residual
// (encoded in place: a separate pointer to the same array would defeat vectorization at its
// aliasing check), which becomes e - scale * sign.
template <bool kFeedback>
inline uint8_t packByte(const float* e, float* residual, size_t first, size_t count, float scale) {
  uint8_t bits = 0;
  for (size_t t = 0; t < count; ++t) {
    const float v = kFeedback ? residual[first + t] : e[first + t];
    const bool plus = v >= 0;  // -0 and +0 both count as +
    bits |= static_cast<uint8_t>(plus) << t;
    if constexpr (kFeedback) residual[first + t] = v - (plus ? scale : -scale);
  }
  return bits;
}

template <bool kFeedback>
void packBits(const float* e, float* residual, size_t n, float scale, uint8_t* bits) {
  const size_t full = n / 8;
  for (size_t b = 0; b < full; ++b) bits[b] = packByte<kFeedback>(e, residual, 8 * b, 8, scale);
  if (n % 8 != 0) bits[full] = packByte<kFeedback>(e, residual, 8 * full, n % 8, scale);
}

// out[first + t] += bit t of `bits` ? plus : -plus, for t < count (<= 8).
inline void unpackByte(uint8_t bits, float plus, float* out, size_t first, size_t count) {
  for (size_t t = 0; t < count; ++t) out[first + t] += ((bits >> t) & 1) != 0 ? plus : -plus;
}

}  // namespace

void signEncode(const float* grad, float* residual, size_t n, uint8_t* message) {
  const float* e = residual != nullptr ? residual : grad;
  double lanes[kLanes] = {};
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t count = std::min(kChunk, n - start);
    if (residual != nullptr) {
      for (size_t i = start; i < start + count; ++i) residual[i] += grad[i];
    }
    addMagnitudes(e + start, count, lanes);
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  // The scale sent, as float: the residual is computed against exactly what peers decode.
  const float scale = n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
  std::memcpy(message, &scale, sizeof(scale));
  uint8_t* bits = message + sizeof(float);
  if (residual != nullptr) {
    packBits<true>(nullptr, residual, n, scale, bits);
  } else {
    packBits<false>(e, nullptr, n, scale, bits);
  }
}

void signAccumulate(const uint8_t* message, size_t n, float weight, float* out) {
  float scale;
  std::memcpy(&scale, message, sizeof(scale));
  // A mean magnitude is finite and >= 0; anything else came from a broken or hostile peer.
  if (!std::isfinite(scale) || scale < 0) {
    SHOAL_THROW(ProtocolError, "one-bit message: scale {} is not a finite mean magnitude (>= 0)",
                scale);
  }
  const float plus = weight * scale;
  const uint8_t* bits = message + sizeof(float);
  const size_t full = n / 8;
  for (size_t b = 0; b < full; ++b) unpackByte(bits[b], plus, out, 8 * b, 8);
  if (n % 8 != 0) unpackByte(bits[full], plus, out, 8 * full, n % 8);
}

}  // namespace shoal::compress
