#include "train/distributed_sampler.h"

#include <numeric>
#include <random>

#include "common/error.h"

namespace shoal::train {

DistributedSampler::DistributedSampler(int64_t datasetSize, int rank, int worldSize,
                                       SamplerOptions options)
    : size_(datasetSize), rank_(rank), world_(worldSize), options_(options) {
  SHOAL_CHECK(worldSize >= 1 && rank >= 0 && rank < worldSize, "sampler: rank {} of {}", rank,
              worldSize);
  SHOAL_CHECK(datasetSize >= 0, "sampler: dataset size {}", datasetSize);
  perRank_ = options_.dropLast ? size_ / world_ : (size_ + world_ - 1) / world_;
  if (perRank_ == 0 && size_ > 0 && options_.dropLast) {
    SHOAL_THROW(InvalidArgument, "sampler: {} samples cannot give each of {} ranks one", size_,
                world_);
  }
}

std::vector<int64_t> epochPermutation(int64_t datasetSize, const SamplerOptions& options,
                                      int64_t epoch) {
  std::vector<int64_t> all(static_cast<size_t>(datasetSize));
  std::iota(all.begin(), all.end(), 0);
  if (options.shuffle) {
    // Fisher-Yates with a fixed generator: std::shuffle's algorithm is not specified, and the
    // permutation must be the same on every rank and every machine.
    std::mt19937_64 gen(options.seed * 1000003ull + static_cast<uint64_t>(epoch));
    for (size_t i = all.size(); i > 1; --i) {
      std::swap(all[i - 1], all[gen() % i]);
    }
  }
  return all;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all = epochPermutation(size_, options_, epoch);
  const size_t total = static_cast<size_t>(perRank_ * world_);
  for (size_t i = all.size(); i < total; ++i) all.push_back(all[i % static_cast<size_t>(size_)]);
  all.resize(total);
  // Strided, as PyTorch's DistributedSampler: rank r takes r, r + n, r + 2n, ...
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(perRank_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(world_)) {
    mine.push_back(all[i]);
  }
  return mine;
}

}  // namespace shoal::train
