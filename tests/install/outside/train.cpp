// The libtorch layer from an installed Shoal: a model from train/ and one forward pass.
#include <shoal/train/fashion_cnn.h>

#include <cstdio>

int main() {
  shoal::train::FashionCnn model;
  const auto out = model->forward(torch::zeros({2, 1, 28, 28}));
  std::printf("outside_train: output %lld x %lld\n", static_cast<long long>(out.size(0)),
              static_cast<long long>(out.size(1)));
  return out.size(0) == 2 && out.size(1) == 10 ? 0 : 1;
}
