#include "train/tensor/row_linear.h"

#include "common/error.h"
#include "train/tensor/regions.h"

namespace shoal::train::tensor {

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& fullWeight,
                                             const torch::Tensor& fullBias, TensorGroup tg,
                                             RowOptions options)
    : tg_(std::move(tg)), options_(options) {
  SHOAL_CHECK(fullWeight.dim() == 2, "row-parallel linear: the weight must be 2-D, got {}-D",
              fullWeight.dim());
  inFeatures_ = fullWeight.size(1);
  if (inFeatures_ < tg_.size() || (!options_.inputIsParallel && inFeatures_ % tg_.size() != 0)) {
    SHOAL_THROW(
        InvalidArgument,
        "row-parallel linear: {} input features do not divide over {} tensor-parallel ranks",
        inFeatures_, tg_.size());
  }
  if (fullBias.defined() && fullBias.numel() != fullWeight.size(0)) {
    SHOAL_THROW(InvalidArgument, "row-parallel linear: bias of {} for {} output features",
                fullBias.numel(), fullWeight.size(0));
  }
  const Slice s = sliceOf(inFeatures_, tg_.rank(), tg_.size());
  weight = register_parameter("weight", fullWeight.detach().narrow(1, s.begin, s.size).clone());
  if (fullBias.defined()) bias = register_parameter("bias", fullBias.detach().clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor in = options_.inputIsParallel ? x : scatterToRegion(x, tg_);
  if (in.size(-1) != weight.size(1)) {
    SHOAL_THROW(InvalidArgument,
                "row-parallel linear: input slice of {} features, this rank holds {} of {}",
                in.size(-1), weight.size(1), inFeatures_);
  }
  torch::Tensor out = reduceFromRegion(torch::nn::functional::linear(in, weight), tg_);
  return bias.defined() ? out + bias : out;
}

std::vector<std::pair<std::string, torch::Tensor>> RowParallelLinearImpl::gatherFull() const {
  std::vector<int64_t> sizes;
  for (int r = 0; r < tg_.size(); ++r) sizes.push_back(sliceOf(inFeatures_, r, tg_.size()).size);
  std::vector<std::pair<std::string, torch::Tensor>> out = {
      {"weight", allgatherLastDim(weight.detach(), tg_, sizes)}};
  if (bias.defined()) out.emplace_back("bias", bias.detach().clone());
  return out;
}

}  // namespace shoal::train::tensor
