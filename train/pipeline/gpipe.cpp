// GPipe: every rank runs the forwards of all m micro-batches, then all their backwards.
//
//   p = 2, m = 3 (F = forward, B = backward, digit = micro-batch, . = idle):
//   rank 0:  F0 F1 F2 .  .  B0 B1 B2
//   rank 1:  .  F0 F1 F2 B0 B1 B2
//
// Each forward is preceded by its RecvActivation (except on stage 0) and followed by its
// SendActivation (except on the last stage); each backward by its RecvGradient (except on the
// last stage) and followed by its SendGradient (except on stage 0).
// Backwards run in micro-batch order, not reverse: every schedule then accumulates a parameter's
// gradient over micro-batches in the same order, so GPipe and 1F1B give the same bits, and the
// last stage, which starts the backward chain, needs no activation newer than the others.
// Bubble (p-1)/(m+p-1) for any m; every stage holds all m micro-batches' activations at the
// peak, which is the price of the simplest order.
#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

Schedule gpipe(int stages, int microBatches) {
  if (stages < 1 || microBatches < 1) {
    SHOAL_THROW(InvalidArgument, "gpipe: {} stages, {} micro-batches (need >= 1 each)", stages,
                microBatches);
  }
  Schedule s{.name = "gpipe", .stages = stages, .microBatches = microBatches, .chunks = 1};
  s.ranks.resize(static_cast<size_t>(stages));
  for (int r = 0; r < stages; ++r) {
    for (int mb = 0; mb < microBatches; ++mb) appendForward(s, r, mb, 0);
    for (int mb = 0; mb < microBatches; ++mb) appendBackward(s, r, mb, 0);
  }
  return s;
}

}  // namespace shoal::train::pipeline
