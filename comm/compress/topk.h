// Top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018, "Deep Gradient
// Compression"): of e = gradient + residual, send the k elements of largest magnitude as
// (index, value) pairs; keep the rest in the residual for the next step. The sum over steps of
// what was sent plus the final residual equals the sum of the gradients: nothing is lost.
//
// Wire layout of one rank's message (TopKMessage): k uint32 indices, ascending, then k float32
// values; k is the same on every rank for a buffer of n elements (topkCount), so ranks exchange
// messages with one all-gather.
//
// Thread-safe (pure functions over the caller's buffers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::compress {

// Elements sent for a buffer of n: ceil(n * density), at least 1 (0 for n = 0), at most n; a
// product within a relative 1e-12 of an integer is that integer (100 * 0.07 sends 7, though
// the double product is 7.000000000000001). InvalidArgument unless 0 < density <= 1.
size_t topkCount(size_t n, double density);
// Bytes of one rank's message for k elements.
inline size_t topkMessageBytes(size_t k) {
  return k * (sizeof(uint32_t) + sizeof(float));
}

// e = grad + residual (residual may be null: no error feedback). Writes the k largest |e| as
// indices (ascending) and values into `message` (topkMessageBytes(k) bytes); afterwards
// residual = e with those k elements zeroed. `grad` is not modified. Ties broken by lower index;
// NaN ranks above infinity (so it is always sent: the optimizer decides). k <= n and
// n < 2^32 (InvalidArgument otherwise). Two passes over the buffer (Note [Top-k selection] in
// topk.cpp) and O(k) scratch for gradient-like data.
void topkEncode(const float* grad, float* residual, size_t n, size_t k, uint8_t* message);

// Adds weight * value at each index of one message into out[0..n). The message came from a
// peer: an index >= n or not ascending is a ProtocolError naming it (nothing is written then).
void topkAccumulate(const uint8_t* message, size_t k, float weight, float* out, size_t n);

}  // namespace shoal::compress
