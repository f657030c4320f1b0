#include "train/tensor/vocab_embedding.h"

#include "common/error.h"
#include "train/tensor/regions.h"

namespace shoal::train::tensor {

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& fullWeight,
                                                       TensorGroup tg)
    : tg_(std::move(tg)) {
  SHOAL_CHECK(fullWeight.dim() == 2, "vocabulary-parallel embedding: the weight must be 2-D");
  vocabulary_ = fullWeight.size(0);
  if (vocabulary_ < tg_.size()) {
    SHOAL_THROW(InvalidArgument,
                "vocabulary-parallel embedding: a vocabulary of {} over {} tensor-parallel ranks",
                vocabulary_, tg_.size());
  }
  slice_ = sliceOf(vocabulary_, tg_.rank(), tg_.size());
  weight = register_parameter("weight",
                              fullWeight.detach().narrow(0, slice_.begin, slice_.size).clone());
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (tokens.scalar_type() != torch::kInt64) {
    SHOAL_THROW(InvalidArgument, "vocabulary-parallel embedding: token ids must be int64, got {}",
                std::string(c10::toString(tokens.scalar_type())));
  }
  if (tokens.numel() > 0 &&
      (tokens.min().item<int64_t>() < 0 || tokens.max().item<int64_t>() >= vocabulary_)) {
    SHOAL_THROW(InvalidArgument, "vocabulary-parallel embedding: token ids outside [0, {})",
                vocabulary_);
  }
  if (!tg_.parallel()) return torch::embedding(weight, tokens);
  torch::Tensor outside = (tokens < slice_.begin) | (tokens >= slice_.begin + slice_.size);
  torch::Tensor local = (tokens - slice_.begin).masked_fill(outside, 0);
  torch::Tensor partial = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduceFromRegion(partial, tg_);
}

std::vector<std::pair<std::string, torch::Tensor>> VocabParallelEmbeddingImpl::gatherFull() const {
  std::vector<int64_t> sizes;
  for (int r = 0; r < tg_.size(); ++r) sizes.push_back(sliceOf(vocabulary_, r, tg_.size()).size);
  return {{"weight", allgatherLastDim(weight.detach().t(), tg_, sizes).t().contiguous()}};
}

}  // namespace shoal::train::tensor
