// The benchmark's baseline: the example's model, data, batch, optimizer and learning-rate
// schedule in one plain libtorch process, no Shoal group, no DDP. Prints one JSON line per
// epoch (samples/s, epoch time, test accuracy) like fashion_mnist --metrics.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "train/allocator.h"
#include "train/distributed_sampler.h"
#include "train/fashion_cnn.h"
#include "train/idx_dataset.h"
#include "train/optim.h"

using namespace shoal;

int main(int argc, char** argv) {
  CLI::App app{"plain libtorch training (the DDP benchmark's baseline)"};
  int64_t epochs = 3, batch = 64;
  double lr = 1e-3;
  uint64_t seed = 1;
  app.add_option("--epochs", epochs);
  app.add_option("--batch", batch);
  app.add_option("--lr", lr);
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);
  train::keepFreedMemoryForReuse();
  torch::set_num_threads(1);
  torch::manual_seed(seed);
  auto trainSet = train::readIdxDataset(train::kFashionMnistDir, "train");
  auto testSet = train::readIdxDataset(train::kFashionMnistDir, "t10k");
  train::FashionCnn model;
  auto opt = train::makeOptimizer(model->parameters(), {train::OptimizerKind::kAdam, lr});
  train::DistributedSampler sampler(trainSet.size(), 0, 1, {.seed = seed});
  LrSchedule schedule(lr, 1, false, 0, epochs * sampler.batches(batch));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto order = sampler.indices(epoch);
    auto idxAll =
        torch::from_blob(order.data(), {static_cast<int64_t>(order.size())}, torch::kInt64);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < sampler.batches(batch); ++b) {
      auto idx = idxAll.slice(0, b * batch, std::min<int64_t>((b + 1) * batch, order.size()));
      train::setLearningRate(*opt, schedule.at(step++));
      opt->zero_grad();
      auto loss =
          torch::nn::functional::cross_entropy(model->forward(trainSet.images.index_select(0, idx)),
                                               trainSet.labels.index_select(0, idx));
      loss.backward();
      opt->step();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    torch::NoGradGuard noGrad;
    model->eval();
    int64_t correct = 0;
    for (int64_t at = 0; at < testSet.size(); at += 250) {
      auto x = testSet.images.slice(0, at, std::min<int64_t>(at + 250, testSet.size()));
      auto y = testSet.labels.slice(0, at, std::min<int64_t>(at + 250, testSet.size()));
      correct += model->forward(x).argmax(1).eq(y).sum().item<int64_t>();
    }
    model->train();
    std::printf("%s\n", nlohmann::json{{"epoch", epoch + 1},
                                       {"ranks", 1},
                                       {"epoch_seconds", seconds},
                                       {"samples_per_second", order.size() / seconds},
                                       {"test_accuracy", double(correct) / testSet.size()}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
