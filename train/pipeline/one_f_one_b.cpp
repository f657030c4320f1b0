// 1F1B (PipeDream-flush): rank r runs w = min(p-r-1, m) warm-up forwards, then alternates one
// forward and the backward of its oldest micro-batch in flight, then drains the remaining
// backwards.
//
//   p = 3, m = 4 (F = forward, B = backward, digit = micro-batch, . = idle):
//   rank 0:  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
//   rank 1:  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3
//   rank 2:  .  .  F0 B0 F1 B1 F2 B2 F3 B3
//
// Same bubble as GPipe, (p-1)/(m+p-1), but a backward frees a micro-batch's activations as soon
// as the pipeline allows: rank r holds at most min(p-r, m) micro-batches, not m.
// Warm-up p-r-1 is just enough: rank r's first backward needs the gradient that comes back
// after micro-batch 0 went through the p-r-1 later stages, and the forwards it runs meanwhile
// are what fills that wait (sends never block, so no more slack is needed for the lists to
// run; see interleaved.cpp for why that schedule keeps more).
// Backwards run in micro-batch order, as in every schedule here (see gpipe.cpp).
#include <algorithm>

#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

Schedule oneForwardOneBackward(int stages, int microBatches) {
  if (stages < 1 || microBatches < 1) {
    SHOAL_THROW(InvalidArgument, "1f1b: {} stages, {} micro-batches (need >= 1 each)", stages,
                microBatches);
  }
  Schedule s{.name = "1f1b", .stages = stages, .microBatches = microBatches, .chunks = 1};
  s.ranks.resize(static_cast<size_t>(stages));
  for (int r = 0; r < stages; ++r) {
    const int warmup = std::min(stages - r - 1, microBatches);
    int forwards = 0;
    while (forwards < warmup) appendForward(s, r, forwards++, 0);
    for (int backwards = 0; backwards < microBatches; ++backwards) {
      if (forwards < microBatches) appendForward(s, r, forwards++, 0);
      appendBackward(s, r, backwards, 0);
    }
  }
  return s;
}

}  // namespace shoal::train::pipeline
