// A small GPT-style decoder-only language model whose layers can be split over tensor-parallel
// ranks (train/tensor/) and cut into pipeline stages (train/pipeline/): a torch::nn::Sequential
// of [embedding, block x layers, head], each layer one tensor in and one out, so the pipeline
// can place the cuts between any two of them.
//
// The same code is the one-process model (a TensorGroup of size 1: every collective is the
// identity). Every full parameter is drawn from one generator seeded with config.seed in a fixed
// order, then each rank keeps its slice: a model split over any number of ranks starts as the
// same full model as the one-process one, so their training can be compared number for number.
//
// Layers: embedding = vocabulary-parallel token embedding + learned positions; block = pre-norm
// causal self-attention (heads split) and a GELU feed-forward (inner size split), each with a
// residual; head = final norm and a vocabulary-parallel output projection, leaving the logits
// split by vocabulary: the loss (gptLoss) is vocabulary-parallel cross-entropy and never
// gathers them. Layer norms and positions are kept whole on every rank (their gradients agree
// across tensor-parallel ranks without any exchange). No dropout (so runs are deterministic).
//
// Contract: forward and backward are collective over the tensor group; one training thread.
// validate() and the constructors throw InvalidArgument for a configuration the grid cannot
// split, naming the sizes, before anything moves.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/tensor/attention.h"
#include "train/tensor/column_linear.h"
#include "train/tensor/mlp.h"
#include "train/tensor/tensor_group.h"
#include "train/tensor/vocab_embedding.h"

namespace shoal::train {

struct GptConfig {
  int64_t vocabulary = 256;  // bytes
  int64_t sequence = 64;     // longest context
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t inner = 0;  // feed-forward size; 0: 4 x hidden
  uint64_t seed = 1;
  int64_t innerSize() const { return inner > 0 ? inner : 4 * hidden; }
  // "4 layers, hidden 128, 4 heads, feed-forward 512, context 64, vocabulary 256: 0.83 M
  // parameters".
  std::string describe() const;
  int64_t parameterCount() const;
};

// InvalidArgument unless the configuration is valid and splits over `tensor` ranks and
// `stages` pipeline stages (every stage needs at least one of the layers + 2 Sequential
// entries).
void validate(const GptConfig& config, int tensor, int stages = 1);

class GptEmbeddingImpl : public torch::nn::Module {
 public:
  GptEmbeddingImpl(const torch::Tensor& tokenWeight, const torch::Tensor& positions,
                   tensor::TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& tokens);  // int64 [b, s] -> [b, s, hidden]
  tensor::VocabParallelEmbedding token = nullptr;
  torch::Tensor position;  // [sequence, hidden]
};
TORCH_MODULE(GptEmbedding);

class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const tensor::AttentionWeights& attention, const tensor::MlpWeights& mlp,
               int64_t heads, tensor::TensorGroup tg);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm norm1 = nullptr;
  tensor::ParallelSelfAttention attention = nullptr;
  torch::nn::LayerNorm norm2 = nullptr;
  tensor::ParallelMlp mlp = nullptr;
};
TORCH_MODULE(GptBlock);

class GptHeadImpl : public torch::nn::Module {
 public:
  GptHeadImpl(const torch::Tensor& outputWeight, tensor::TensorGroup tg);
  // [b, s, hidden] -> this rank's vocabulary slice of the logits [b, s, slice]
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm norm = nullptr;
  tensor::ColumnParallelLinear output = nullptr;
};
TORCH_MODULE(GptHead);

// The model: [embedding, block x layers, head] (validate()s first).
torch::nn::Sequential makeGpt(const GptConfig& config, const tensor::TensorGroup& tg);

// Mean next-token cross-entropy over every position: output = the head's logits slice
// [b, s, slice], target = int64 [b, s]. Collective over the tensor group.
torch::Tensor gptLoss(const torch::Tensor& output, const torch::Tensor& target,
                      const GptConfig& config, const tensor::TensorGroup& tg);

// The full logits [b, s, vocabulary] from the slices (an all-gather): for sampling text.
torch::Tensor gatherLogits(const torch::Tensor& localLogits, const GptConfig& config,
                           const tensor::TensorGroup& tg);

}  // namespace shoal::train
