// What the DistributedDataParallel tests share: a small network with optional BatchNorm, unused
// and shared layers, its data and optimizer, and two ranks as threads computing a loss.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "train/ddp.h"
#include "train/optim.h"

namespace shoal::test {

constexpr int kRanks = 3;
constexpr int64_t kBatch = 4;  // per rank
constexpr int kSteps = 5;

struct NetImpl : torch::nn::Module {
  NetImpl(bool withUnused, bool withBatchNorm, bool withShared = false) {
    if (withShared) shared = register_module("shared", torch::nn::Linear(8, 8));
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    if (withBatchNorm) bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    if (withUnused) unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (shared) x = shared(torch::tanh(shared(x)));  // one parameter, two uses in the graph
    x = fc1(x);
    if (bn) x = bn(x);
    return fc2(torch::relu(x));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr}, shared{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

struct Case {
  std::string name;
  train::OptimizerKind optimizer = train::OptimizerKind::kSgd;
  bool overlap = true;
  bool noSyncAccumulation = false;  // two micro-batches per step, the first under noSync
  bool unused = false;
  bool batchNorm = false;
  bool shared = false;  // a layer applied twice
};
std::ostream& operator<<(std::ostream& o, const Case& c);

struct Data {
  std::vector<torch::Tensor> x, y;  // per step (and micro-batch): kRanks * kBatch rows
};

// `batches` batches of kRanks * kBatch rows, the same on every call.
Data makeData(int batches);
// The network of `c`, with the same initial parameters on every call.
Net makeNet(const Case& c);
std::unique_ptr<torch::optim::Optimizer> makeOpt(Net& net, const Case& c);
// Rank `rank`'s rows of a batch.
torch::Tensor rows(const torch::Tensor& t, int rank);
// Copies of the parameters and buffers.
std::vector<torch::Tensor> stateOf(Net& net);
// Each rank's own gradients of one batch, computed without DDP on a copy of `c`'s model.
std::vector<torch::Tensor> localGradients(const Case& c, const torch::Tensor& x,
                                          const torch::Tensor& y);

// Two ranks with the model of `c` compute a loss on one batch; `then` does the rest with it.
// Returns each rank's error text.
std::vector<std::string> lossOnTwoRanks(
    const Case& c,
    const std::function<void(train::DistributedDataParallel&, const torch::Tensor&)>& then);

}  // namespace shoal::test
