// 1-bit (scaled sign) compression with error feedback (Seide et al. 2014; Karimireddy et al.
// 2019, "EF-SignSGD"; the compression of 1-bit Adam): of e = gradient + residual, send one sign
// bit per element and one float32 scale, the mean |e|; the residual keeps e - scale * sign(e).
// Usable with any optimizer: the receiver gets a gradient estimate, not an optimizer update.
//
// Wire layout of one rank's message: float32 scale, then ceil(n / 8) bytes of bits (element i
// is bit i % 8 of byte i / 8; 1 means >= 0, -0 included; the unused high bits of the last byte
// are 0). The same size on every rank for n elements.
//
// Thread-safe (pure functions over the caller's buffers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::compress {

inline size_t signMessageBytes(size_t n) {
  return sizeof(float) + (n + 7) / 8;
}

// e = grad + residual (residual may be null). Writes the message (signMessageBytes(n) bytes);
// afterwards residual = e - scale * sign(e), with the float32 scale that was sent. The mean is
// summed in double. `grad` is not modified. A NaN or infinite e makes the scale non-finite:
// such a message is refused by every receiver (signAccumulate).
void signEncode(const float* grad, float* residual, size_t n, uint8_t* message);

// out[i] += weight * scale * (bit i ? +1 : -1) for one message. The message came from a peer:
// a scale that is not finite, or negative (no mean magnitude is), is a ProtocolError (nothing
// is written then).
void signAccumulate(const uint8_t* message, size_t n, float weight, float* out);

}  // namespace shoal::compress
