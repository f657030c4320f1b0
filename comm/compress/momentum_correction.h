// Momentum correction for the error-feedback codecs (Lin et al. 2018, "Deep Gradient
// Compression"): SGD's momentum applied by each rank before compression, instead of by the
// optimizer after it. With the optimizer's momentum after an error-feedback codec, what the
// residual held back for many steps arrives at once and the momentum multiplies it again
// (1 / (1 - m) times) on every step after: the training oscillates. Here the residual holds
// velocities, which arrive once, and the receiver applies them as plain SGD.
//
// Per element, with a velocity u and an accumulation v that the caller keeps across steps (both
// start at 0) and a momentum factor m:
//   u = m u + g        heavy-ball SGD's momentum buffer, of this rank's gradient g
//   v = v + u          the codec's error-feedback residual, accumulating velocities
//   send the codec's message of v; v keeps what was not sent (topk.h, sign.h)
//   top-k only: u = 0 where v was sent (momentum-factor masking)
// The ranks average what they receive and the optimizer subtracts lr times it: plain SGD, with
// no momentum of its own (it would apply momentum twice).
//
// What arrives, against heavy-ball SGD with the same rate on the average gradient:
// - 1-bit sends part of every element and empties none, so nothing is masked: the sum of all
//   that was sent plus v is the sum of the velocities, exactly the distance heavy-ball SGD has
//   moved (with the rate taken as 1); error feedback only delays it.
// - Top-k sends some elements whole. Masking drops a sent element's velocity, so the momentum's
//   tail of the gradients sent (m u + m^2 u + ... = m u / (1 - m)) is never applied: DGC's
//   remedy for staleness, since that tail would otherwise reach the model only when the element
//   is next sent, many steps later, pushing along a direction the model has moved past. An
//   element never sent holds in v exactly heavy-ball SGD's distance; an element sent every step
//   gets plain SGD (at density 1, top-k with momentum correction is SGD without momentum).
//
// Thread-safe (pure functions over the caller's buffers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::compress {

// u = momentum * u + grad, elementwise: the first step of both codecs below, and alone the
// whole of an uncompressed step (whose velocity is sent whole and kept, as heavy-ball SGD keeps
// its buffer).
void momentumUpdate(const float* grad, float* velocity, size_t n, float momentum);

// momentumUpdate, then topkEncode(velocity, accumulation, n, k, message) (topk.h: v += u, the k
// largest |v| sent and zeroed in v), then velocity zeroed at the k indices sent. `grad` is not
// modified. Same preconditions and InvalidArgument as topkEncode.
void topkEncodeWithMomentum(const float* grad, float* velocity, float* accumulation, size_t n,
                            size_t k, float momentum, uint8_t* message);

// momentumUpdate, then signEncode(velocity, accumulation, n, message) (sign.h: v += u, sign bits
// and one scale sent, v keeps v - scale * sign(v)); no masking. `grad` is not modified.
void signEncodeWithMomentum(const float* grad, float* velocity, float* accumulation, size_t n,
                            float momentum, uint8_t* message);

}  // namespace shoal::compress
