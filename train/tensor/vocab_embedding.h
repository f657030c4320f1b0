// A token embedding split by vocabulary over the tensor-parallel ranks (Megatron-LM's
// VocabParallelEmbedding): rank r keeps the rows of its slice of the vocabulary (sliceOf: need
// not be equal), looks up the tokens that fall in it, writes zeros for the others, and the
// partial embeddings are summed by reduceFromRegion (one all-reduce forward, none backward).
//
// Contract: forward is collective over tg.group (see regions.h); one training thread. Token ids
// outside [0, vocabulary) are InvalidArgument (checked before anything moves).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "train/tensor/parallel_layer.h"
#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

class VocabParallelEmbeddingImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // fullWeight [vocabulary, dim].
  VocabParallelEmbeddingImpl(const torch::Tensor& fullWeight, TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& tokens);  // int64 [...] -> [..., dim]
  std::vector<std::pair<std::string, torch::Tensor>> gatherFull() const override;
  bool sliced(std::string_view) const override { return true; }

  Slice vocabSlice() const { return slice_; }
  torch::Tensor weight;  // [slice, dim]

 private:
  TensorGroup tg_;
  int64_t vocabulary_ = 0;
  Slice slice_;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace shoal::train::tensor
