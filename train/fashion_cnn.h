// The CNN the Fashion-MNIST example, its tests and the training benchmark share (the PyTorch
// peer in bench/pytorch_ddp_train.py defines the same layers): two 3x3 conv layers with
// BatchNorm and max-pooling, dropout, two fully connected layers. 421k parameters with the
// default widths; smallCnn() below is the same network at half the widths.
#pragma once

#include <torch/torch.h>

namespace shoal::train {

struct FashionCnnImpl : torch::nn::Module {
  explicit FashionCnnImpl(int64_t channels1 = 32, int64_t channels2 = 64, int64_t hidden = 128)
      : conv1(torch::nn::Conv2dOptions(1, channels1, 3).padding(1)),
        bn1(channels1),
        conv2(torch::nn::Conv2dOptions(channels1, channels2, 3).padding(1)),
        bn2(channels2),
        fc1(channels2 * 7 * 7, hidden),
        fc2(hidden, 10),
        dropout(0.25) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("dropout", dropout);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    x = dropout(torch::relu(fc1(x.flatten(1))));
    return fc2(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(FashionCnn);

// For the DDP benchmark, where communication weighs more against compute: 106k parameters (the
// first fully connected layer holds 95% of them), about a quarter of the multiply-adds. The
// PyTorch peer's SmallCnn in bench/pytorch_ddp_train.py has the same layers.
inline FashionCnn smallCnn() {
  return FashionCnn(16, 32, 64);
}

}  // namespace shoal::train
