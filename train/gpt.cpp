#include "train/gpt.h"

#include <fmt/format.h>

#include <cmath>

#include "common/error.h"
#include "train/process_grid.h"
#include "train/tensor/regions.h"
#include "train/tensor/vocab_cross_entropy.h"

namespace shoal::train {

std::string GptConfig::describe() const {
  return fmt::format(
      "{} layers, hidden {}, {} heads, feed-forward {}, context {}, vocabulary {}: {:.2f} M "
      "parameters",
      layers, hidden, heads, innerSize(), sequence, vocabulary, parameterCount() / 1e6);
}

int64_t GptConfig::parameterCount() const {
  const int64_t h = hidden, f = innerSize();
  const int64_t block = 4 * h /*norms*/ + 3 * h * h + 3 * h + h * h + h + f * h + f + h * f + h;
  return vocabulary * h + sequence * h + layers * block + 2 * h + vocabulary * h;
}

void validate(const GptConfig& c, int tensor, int stages) {
  auto positive = [](const char* what, int64_t v) {
    if (v < 1) SHOAL_THROW(InvalidArgument, "gpt: {} must be >= 1, got {}", what, v);
  };
  positive("vocabulary", c.vocabulary);
  positive("sequence", c.sequence);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("layers", c.layers);
  positive("tensor-parallel size", tensor);
  positive("pipeline stages", stages);
  if (c.hidden % c.heads != 0) {
    SHOAL_THROW(InvalidArgument, "gpt: {} heads do not divide hidden size {}", c.heads, c.hidden);
  }
  requireDivisible("attention heads", c.heads, "tensor", tensor);
  requireDivisible("feed-forward units", c.innerSize(), "tensor", tensor);
  if (c.vocabulary < tensor) {
    SHOAL_THROW(InvalidArgument, "tensor parallelism: a vocabulary of {} over tensor {}",
                c.vocabulary, tensor);
  }
  if (c.layers + 2 < stages) {
    SHOAL_THROW(InvalidArgument,
                "pipeline: {} layers (+ embedding and head) cannot fill {} pipeline stages",
                c.layers, stages);
  }
}

GptEmbeddingImpl::GptEmbeddingImpl(const torch::Tensor& tokenWeight, const torch::Tensor& positions,
                                   tensor::TensorGroup tg) {
  token = register_module("token", tensor::VocabParallelEmbedding(tokenWeight, std::move(tg)));
  position = register_parameter("position", positions.detach().clone());
}

torch::Tensor GptEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) > position.size(0)) {
    SHOAL_THROW(InvalidArgument, "gpt: tokens {} must be [batch, sequence <= {}]",
                c10::str(tokens.sizes()), position.size(0));
  }
  return token->forward(tokens) + position.narrow(0, 0, tokens.size(1));
}

GptBlockImpl::GptBlockImpl(const tensor::AttentionWeights& attn, const tensor::MlpWeights& ff,
                           int64_t heads, tensor::TensorGroup tg) {
  const int64_t hidden = attn.projWeight.size(0);
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
  attention = register_module("attention", tensor::ParallelSelfAttention(attn, heads, tg));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
  mlp = register_module("mlp", tensor::ParallelMlp(ff, tg));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x + attention->forward(norm1->forward(x));
  return h + mlp->forward(norm2->forward(h));
}

GptHeadImpl::GptHeadImpl(const torch::Tensor& outputWeight, tensor::TensorGroup tg) {
  const int64_t hidden = outputWeight.size(1);
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
  output =
      register_module("output", tensor::ColumnParallelLinear(outputWeight, torch::Tensor(), tg));
}

torch::Tensor GptHeadImpl::forward(const torch::Tensor& x) {
  return output->forward(norm->forward(x));
}

torch::nn::Sequential makeGpt(const GptConfig& c, const tensor::TensorGroup& tg) {
  validate(c, tg.size());
  // Every full tensor comes from this generator in this order, whatever the split.
  at::Generator gen = at::detail::createCPUGenerator(c.seed);
  const double std = 0.02;
  // GPT-2's scaling of the layers that write into the residual stream.
  const double residualStd = 0.02 / std::sqrt(2.0 * c.layers);
  auto normal = [&](std::vector<int64_t> shape, double s) {
    return at::normal(0.0, s, shape, gen);
  };
  const int64_t h = c.hidden, f = c.innerSize();
  torch::nn::Sequential net;
  torch::Tensor tokens = normal({c.vocabulary, h}, std);
  torch::Tensor positions = normal({c.sequence, h}, std);
  net->push_back("embedding", GptEmbedding(tokens, positions, tg));
  for (int64_t i = 0; i < c.layers; ++i) {
    tensor::AttentionWeights attn{normal({3 * h, h}, std), torch::zeros({3 * h}),
                                  normal({h, h}, residualStd), torch::zeros({h})};
    tensor::MlpWeights ff{normal({f, h}, std), torch::zeros({f}), normal({h, f}, residualStd),
                          torch::zeros({h})};
    net->push_back(fmt::format("block{}", i), GptBlock(attn, ff, c.heads, tg));
  }
  net->push_back("head", GptHead(normal({c.vocabulary, h}, std), tg));
  return net;
}

torch::Tensor gptLoss(const torch::Tensor& output, const torch::Tensor& target, const GptConfig& c,
                      const tensor::TensorGroup& tg) {
  const tensor::Slice vocab = tensor::sliceOf(c.vocabulary, tg.rank(), tg.size());
  if (output.size(-1) != vocab.size) {
    SHOAL_THROW(InvalidArgument, "gpt loss: logits slice of {}, this rank holds {} of {}",
                output.size(-1), vocab.size, c.vocabulary);
  }
  return tensor::vocabParallelCrossEntropy(output, target, vocab.begin, tg).mean();
}

torch::Tensor gatherLogits(const torch::Tensor& localLogits, const GptConfig& c,
                           const tensor::TensorGroup& tg) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < tg.size(); ++r)
    sizes.push_back(tensor::sliceOf(c.vocabulary, r, tg.size()).size);
  return tensor::allgatherLastDim(localLogits.detach(), tg, sizes);
}

}  // namespace shoal::train
