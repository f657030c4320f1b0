// The model checkpoint_fuzz loads into, shared with the seed generator: parameters, a buffer
// (batch norm's running statistics) and Adam's per-parameter state.
#include <torch/torch.h>

namespace shoal::fuzz {

std::shared_ptr<torch::nn::Module> makeCheckpointModel() {
  auto m = std::make_shared<torch::nn::Module>();
  m->register_module("fc", torch::nn::Linear(4, 3));
  m->register_module("bn", torch::nn::BatchNorm1d(3));
  return m;
}

}  // namespace shoal::fuzz
