// The deep model of the pipeline example, its tests and its benchmark (the PyTorch peers in
// bench/pytorch_pipeline.py define the same layers): a residual MLP for 28x28 images, handed
// over as a flat torch::nn::Sequential so that a pipeline can cut it anywhere between layers.
//
//   Flatten -> Linear(784, hidden) -> blocks x ResidualBlock(hidden) -> LayerNorm(hidden)
//           -> Linear(hidden, 10)
//   ResidualBlock(x) = x + fc2(relu(fc1(layer_norm(x))))      (fc1, fc2: hidden x hidden)
//
// LayerNorm rather than BatchNorm: a micro-batch then computes exactly what the whole batch
// would, so a pipeline's result can be compared with one-process training. With the defaults
// (12 blocks of 256) it has 1.79 M parameters, 2 * 12 equal blocks that balance well.
#pragma once

#include <torch/torch.h>

namespace shoal::train {

struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(int64_t hidden)
      : norm(torch::nn::LayerNormOptions({hidden})), fc1(hidden, hidden), fc2(hidden, hidden) {
    register_module("norm", norm);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::relu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ResidualBlock);

inline torch::nn::Sequential residualMlp(int64_t blocks = 12, int64_t hidden = 256) {
  torch::nn::Sequential net;
  net->push_back("flatten", torch::nn::Flatten());
  net->push_back("stem", torch::nn::Linear(28 * 28, hidden));
  for (int64_t b = 0; b < blocks; ++b)
    net->push_back("block" + std::to_string(b), ResidualBlock(hidden));
  net->push_back("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
  net->push_back("head", torch::nn::Linear(hidden, 10));
  return net;
}

}  // namespace shoal::train
