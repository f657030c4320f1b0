// A wide MLP for Fashion-MNIST images, served by shoal-serve as "fashion_mlp"
// (train/export/served_model.h): 784 - hidden - hidden - 10 with ReLUs. With the default width
// (4096) it holds 20.0 M parameters, 80 MB of float32 weights: more than this host's caches, so a
// forward of one image is bound by reading the weights, and a batch reads them once for all its
// images (bench/results/serve.md). Its state_dict names are fc1/fc2/fc3 .weight/.bias, as a
// PyTorch module with three nn.Linear attributes of those names writes them.
#pragma once

#include <torch/torch.h>

namespace shoal::train {

struct FashionMlpImpl : torch::nn::Module {
  explicit FashionMlpImpl(int64_t hidden = 4096)
      : fc1(784, hidden), fc2(hidden, hidden), fc3(hidden, 10) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }

  // x: images of any shape whose trailing dimensions hold 784 values (N×784 or N×1×28×28).
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc3(x);
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(FashionMlp);

}  // namespace shoal::train
