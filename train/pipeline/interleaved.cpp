// Interleaved 1F1B (Megatron-LM's virtual pipeline stages): rank r holds v chunks, chunk c being
// virtual stage c*p + r, so a micro-batch crosses every rank v times and each forward or backward
// is 1/v of the rank's share of the model. Filling and draining the pipeline then takes p-1
// chunk steps instead of p-1 stage steps: the bubble shrinks by about v, for v times more
// transfers.
//
// Every rank runs the same two orders of (micro-batch, chunk) pairs.
// - Micro-batches are cut into groups; a group goes through chunk 0, then chunk 1, ..., and then
//   the next group starts. Backwards take the groups in the same order, chunks from v-1 down.
//   Groups hold p micro-batches, except the first, which also takes the remainder m mod p (it
//   holds p .. 2p-1 micro-batches; all m when m < 2p). A group of at least p keeps rank 0 busy
//   while a micro-batch goes once around the ring: its chunk c+1 forward waits on rank p-1's
//   chunk c forward, which is p-1 steps behind. A smaller trailing group (which Megatron
//   refuses) would leave rank 0 idle there, and with the warm-up below the lists can deadlock.
// - Rank r runs w = (v-1)*g + 2*(p-r-1) warm-up forwards (g the first group's size, the largest;
//   all v*m when that is more), then alternates one forward and one backward, then drains the
//   backwards. (v-1)*g is what the backward order lags behind the forward order inside a group,
//   so every backward finds its forward already run. The 2*(p-r-1), not 1F1B's p-r-1: each
//   step's gradient comes back around the ring from the stage after, and one extra step per
//   stage of slack keeps a transfer's latency from stalling every steady step (with free
//   transfers p-r-1 would do; in the cost model, a backward costing two forwards and a transfer
//   0.3 of one, p = 4, m = 16, v = 2 idles 0.12 of the step instead of 0.21).
//
//   p = 2, m = 4, v = 2 (F/B = forward/backward, digit = micro-batch, a/b = chunk 0/1):
//   rank 0: F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a .   B2b .   B3b B2a B3a
//   rank 1: .   F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a
//
// Bubble in the cost model (free transfers, any forward and backward costs): (p-1)/(v*m+p-1)
// for every m >= p, multiple of p or not. For m < p the ring cannot be filled:
// (v*(p-m)+m-1)/(v*p+m-1), below 1F1B's (p-1)/(m+p-1) for 1 < m < p, equal at m = 1.
// Peak in flight on rank r: min(v*m, (v-1)*g + 2*(p-r-1) + 1) chunk activations, each 1/v of a
// stage's. p = 1 or v = 1 are 1F1B (nothing to interleave).
#include <algorithm>
#include <vector>

#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

namespace {

struct Step {
  int microBatch;
  int chunk;
};

// Group sizes: p each, the first taking the remainder (one group of m when m < 2p).
std::vector<int> groupSizes(int stages, int microBatches) {
  const int groups = std::max(1, microBatches / stages);
  std::vector<int> sizes(static_cast<size_t>(groups), stages);
  sizes[0] = microBatches - (groups - 1) * stages;
  return sizes;
}

}  // namespace

Schedule interleavedOneForwardOneBackward(int stages, int microBatches, int chunks) {
  if (stages < 1 || microBatches < 1 || chunks < 1) {
    SHOAL_THROW(InvalidArgument,
                "interleaved: {} stages, {} micro-batches, {} chunks (need >= 1 each)", stages,
                microBatches, chunks);
  }
  if (stages == 1 || chunks == 1) {
    Schedule s = oneForwardOneBackward(stages, microBatches);
    s.name = "interleaved";
    return s;
  }

  const std::vector<int> sizes = groupSizes(stages, microBatches);
  std::vector<Step> forwardOrder, backwardOrder;
  for (int first = 0; int size : sizes) {
    for (int c = 0; c < chunks; ++c) {
      for (int mb = first; mb < first + size; ++mb) forwardOrder.push_back({mb, c});
    }
    for (int c = chunks - 1; c >= 0; --c) {
      for (int mb = first; mb < first + size; ++mb) backwardOrder.push_back({mb, c});
    }
    first += size;
  }

  Schedule s{
      .name = "interleaved", .stages = stages, .microBatches = microBatches, .chunks = chunks};
  s.ranks.resize(static_cast<size_t>(stages));
  const int total = microBatches * chunks;
  for (int r = 0; r < stages; ++r) {
    const int warmup = std::min(total, (chunks - 1) * sizes[0] + 2 * (stages - r - 1));
    int forwards = 0;
    auto forward = [&] {
      const Step& f = forwardOrder[static_cast<size_t>(forwards++)];
      appendForward(s, r, f.microBatch, f.chunk);
    };
    while (forwards < warmup) forward();
    for (int backwards = 0; backwards < total; ++backwards) {
      if (forwards < total) forward();
      const Step& b = backwardOrder[static_cast<size_t>(backwards)];
      appendBackward(s, r, b.microBatch, b.chunk);
    }
  }
  return s;
}

}  // namespace shoal::train::pipeline
