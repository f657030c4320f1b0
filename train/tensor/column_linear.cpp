#include "train/tensor/column_linear.h"

#include "common/error.h"
#include "train/tensor/regions.h"

namespace shoal::train::tensor {

torch::Tensor sliceBlocks(const torch::Tensor& full, int blocks, const Slice& slice) {
  const int64_t blockSize = full.size(0) / blocks;
  std::vector<torch::Tensor> parts;
  for (int b = 0; b < blocks; ++b) {
    parts.push_back(full.narrow(0, b * blockSize + slice.begin, slice.size));
  }
  return torch::cat(parts, 0).clone();
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& fullWeight,
                                                   const torch::Tensor& fullBias, TensorGroup tg,
                                                   ColumnOptions options)
    : tg_(std::move(tg)), options_(options) {
  SHOAL_CHECK(fullWeight.dim() == 2, "column-parallel linear: the weight must be 2-D, got {}-D",
              fullWeight.dim());
  if (options_.blocks < 1 || fullWeight.size(0) % options_.blocks != 0) {
    SHOAL_THROW(InvalidArgument, "column-parallel linear: {} output features are not {} blocks",
                fullWeight.size(0), options_.blocks);
  }
  blockSize_ = fullWeight.size(0) / options_.blocks;
  if (blockSize_ < tg_.size() || (options_.gatherOutput && blockSize_ % tg_.size() != 0)) {
    SHOAL_THROW(InvalidArgument,
                "column-parallel linear: {} output features do not divide over {} tensor-parallel "
                "ranks",
                blockSize_, tg_.size());
  }
  if (fullBias.defined() && fullBias.numel() != fullWeight.size(0)) {
    SHOAL_THROW(InvalidArgument, "column-parallel linear: bias of {} for {} output features",
                fullBias.numel(), fullWeight.size(0));
  }
  slice_ = sliceOf(blockSize_, tg_.rank(), tg_.size());
  weight = register_parameter("weight", sliceBlocks(fullWeight.detach(), options_.blocks, slice_));
  if (fullBias.defined()) {
    bias = register_parameter("bias", sliceBlocks(fullBias.detach(), options_.blocks, slice_));
  }
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor in = options_.copyInput ? copyToRegion(x, tg_) : x;
  torch::Tensor out = torch::nn::functional::linear(in, weight, bias);
  if (!options_.gatherOutput) return out;
  torch::Tensor full = gatherFromRegion(out, tg_);  // [..., rank, block, slice]
  if (options_.blocks == 1) return full;
  std::vector<int64_t> shape(full.sizes().begin(), full.sizes().end() - 1);
  std::vector<int64_t> split = shape;
  split.insert(split.end(), {tg_.size(), options_.blocks, slice_.size});
  shape.push_back(full.size(-1));
  return full.view(split).transpose(-3, -2).reshape(shape);  // [..., block, rank, slice]
}

std::vector<std::pair<std::string, torch::Tensor>> ColumnParallelLinearImpl::gatherFull() const {
  std::vector<int64_t> sizes;
  for (int r = 0; r < tg_.size(); ++r) sizes.push_back(sliceOf(blockSize_, r, tg_.size()).size);
  // Dimension 0 of each block, gathered as the last dimension of the transpose.
  auto gatherRows = [&](const torch::Tensor& local) {
    torch::Tensor twoD = local.detach().reshape({local.size(0), -1});
    std::vector<torch::Tensor> blocks;
    for (int b = 0; b < options_.blocks; ++b) {
      torch::Tensor part = twoD.narrow(0, b * slice_.size, slice_.size).t();
      blocks.push_back(allgatherLastDim(part, tg_, sizes).t());
    }
    torch::Tensor full = torch::cat(blocks, 0);
    return local.dim() == 1 ? full.reshape({-1}) : full;
  };
  std::vector<std::pair<std::string, torch::Tensor>> out = {{"weight", gatherRows(weight)}};
  if (bias.defined()) out.emplace_back("bias", gatherRows(bias));
  return out;
}

}  // namespace shoal::train::tensor
