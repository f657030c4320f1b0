#include "train/elastic_sampler.h"

#include "common/error.h"

namespace shoal::train {

ElasticSampler::ElasticSampler(int64_t datasetSize, SamplerOptions options)
    : size_(datasetSize), options_(options) {
  if (datasetSize < 0)
    SHOAL_THROW(InvalidArgument, "elastic sampler: dataset size {}", datasetSize);
}

ElasticStep ElasticSampler::step(int64_t epoch, int64_t position, int rank, int world,
                                 int64_t batch) const {
  if (position < 0 || position >= size_ || batch < 1 || world < 1 || rank < 0 || rank >= world) {
    SHOAL_THROW(InvalidArgument,
                "elastic sampler: position {} of {} samples, batch {}, rank {} of {}", position,
                size_, batch, rank, world);
  }
  if (epoch != cachedEpoch_) {
    order_ = epochPermutation(size_, options_, epoch);
    cachedEpoch_ = epoch;
  }
  const int64_t remaining = size_ - position;
  ElasticStep s;
  int64_t lo = 0, hi = 0;
  if (remaining >= batch * world) {
    s.total = batch * world;
    lo = batch * rank;
    hi = lo + batch;
  } else {
    s.total = remaining;
    lo = remaining * rank / world;
    hi = remaining * (rank + 1) / world;
  }
  s.indices.assign(order_.begin() + position + lo, order_.begin() + position + hi);
  s.nextPosition = position + s.total;
  return s;
}

}  // namespace shoal::train
