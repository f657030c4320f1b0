// Shards a dataset's indices across ranks, reshuffled each epoch.
//
// Every rank gets the same number of samples (and so runs the same number of steps: uneven
// shards would leave one rank waiting in an all-reduce the others never start). The tail is
// padded by wrapping around to the start of the permutation, or dropped (dropLast).
// The permutation depends only on (seed, epoch), never on the rank or the world size's
// scheduling, so every rank computes the same one, and a resumed run the same as before.
#pragma once

#include <cstdint>
#include <vector>

namespace shoal::train {

struct SamplerOptions {
  bool shuffle = true;
  bool dropLast = false;
  uint64_t seed = 0;
};

// The order of `epoch`'s samples, 0..datasetSize-1 shuffled by (seed, epoch) when
// options.shuffle, the same on every rank and machine: what DistributedSampler deals out, and
// what train/elastic_sampler.h walks through whatever the world size.
std::vector<int64_t> epochPermutation(int64_t datasetSize, const SamplerOptions& options,
                                      int64_t epoch);

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, SamplerOptions options = {});

  // This rank's indices for `epoch`, in order.
  std::vector<int64_t> indices(int64_t epoch) const;
  // Samples per rank per epoch.
  int64_t perRank() const { return perRank_; }
  // Batches per rank per epoch of `batch` samples (the last one may be smaller).
  int64_t batches(int64_t batch) const { return (perRank_ + batch - 1) / batch; }

 private:
  int64_t size_;
  int rank_;
  int world_;
  SamplerOptions options_;
  int64_t perRank_;
};

}  // namespace shoal::train
