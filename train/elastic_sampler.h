// The data order of an elastic job: every epoch's permutation (train/distributed_sampler.h's
// epochPermutation) is consumed from the front, `batch` samples per rank and step, so progress
// is one number, the position: how many of the epoch's samples all ranks together have taken.
// When the world changes size, the ranks of the new view go on from the committed position, and
// no sample of the epoch is skipped or taken twice.
//
// A step at `position` gives rank r the samples [position + r * b, position + (r + 1) * b) of
// the permutation, b = batch, while at least batch * world samples remain; the epoch's last
// step spreads what remains as evenly as possible (rank r gets remaining * r / world up to
// remaining * (r + 1) / world), so a rank may get fewer samples than the others, or none when
// fewer samples than ranks remain. Its `total` says how many the step has across all ranks: a
// loss summed over this rank's samples and scaled by world / total makes the average over ranks
// (what DDP computes) the exact mean over the step's samples, however they were spread.
//
// Not thread-safe: one sampler per thread (it keeps the last epoch's permutation).
#pragma once

#include <cstdint>
#include <vector>

#include "train/distributed_sampler.h"

namespace shoal::train {

struct ElasticStep {
  std::vector<int64_t> indices;  // this rank's samples
  int64_t total = 0;             // the step's samples across all ranks
  int64_t nextPosition = 0;      // the position after the step (== datasetSize: epoch done)
};

class ElasticSampler {
 public:
  // InvalidArgument for a negative size.
  ElasticSampler(int64_t datasetSize, SamplerOptions options = {});

  // Rank `rank` of `world`'s samples for the step at `position` of `epoch`. InvalidArgument
  // when position is outside [0, datasetSize), batch < 1 or rank outside [0, world).
  ElasticStep step(int64_t epoch, int64_t position, int rank, int world, int64_t batch) const;

  int64_t size() const { return size_; }

 private:
  int64_t size_;
  SamplerOptions options_;
  // The last epoch's permutation, kept: steps ask for the same epoch many times.
  mutable int64_t cachedEpoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace shoal::train
