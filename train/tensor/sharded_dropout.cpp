#include "train/tensor/sharded_dropout.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "common/error.h"
#include "common/splitmix.h"

namespace shoal::train::tensor {
namespace {

// One draw from the shared stream (libtorch's default CPU generator).
uint64_t sharedDraw() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

}  // namespace

ShardedDropoutImpl::ShardedDropoutImpl(double p, TensorGroup tg) : p_(p), tg_(std::move(tg)) {
  SHOAL_CHECK(p >= 0 && p < 1, "ShardedDropout: p must be in [0, 1), got {}", p);
}

torch::Tensor ShardedDropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || p_ == 0) return x;
  const uint64_t seed = splitmix64(sharedDraw() ^ splitmix64(static_cast<uint64_t>(tg_.rank())));
  at::Generator own = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor keep =
      torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kFloat)).bernoulli_(1 - p_, own);
  return x * keep.to(x.device(), x.scalar_type()) * (1 / (1 - p_));
}

}  // namespace shoal::train::tensor
