// The DDP benchmark's C++ training loop: the example's data, batch, optimizer and learning-rate
// schedule, on either CNN (--model fashion: train/fashion_cnn.h, the example's; --model small:
// train/fashion_cnn.h's smallCnn(), where communication weighs more). Plainly (one process, no
// Shoal group, no DDP: the baseline), or with --ddp as a rank of a Shoal job (`shoal run -n N --
// plain_train
// --ddp`), the same loop wrapped in DistributedDataParallel, so the two differ in DDP only.
// Prints one JSON line per epoch from rank 0 (samples/s over all ranks, epoch time, test
// accuracy), like fashion_mnist --metrics, and where each rank's time went, averaged over the
// ranks: CPU time per step (this process, every thread: on a shared machine it moves far less
// with other tenants' load than the wall clock does) and, with --ddp, the milliseconds per step
// in beforeForward()'s buffer broadcast and in finishing the gradient synchronization.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/ddp.h"
#include "train/distributed_sampler.h"
#include "train/fashion_cnn.h"
#include "train/idx_dataset.h"
#include "train/optim.h"

using namespace shoal;

namespace {

std::shared_ptr<torch::nn::Module> makeModel(const std::string& name) {
  if (name == "fashion") return train::FashionCnn().ptr();
  if (name == "small") return train::smallCnn().ptr();
  SHOAL_THROW(InvalidArgument, "--model: unknown model '{}' (fashion or small)", name);
}

torch::Tensor forward(const std::shared_ptr<torch::nn::Module>& m, const torch::Tensor& x) {
  return std::dynamic_pointer_cast<train::FashionCnnImpl>(m)->forward(x);
}

double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the DDP benchmark's libtorch training loop (plain, or --ddp under shoal run)"};
  int64_t epochs = 3, batch = 64, steps = 0;
  double lr = 1e-3;
  uint64_t seed = 1;
  std::string model = "fashion";
  bool ddpMode = false, noMallocTuning = false;
  app.add_option("--epochs", epochs)->check(CLI::Range(int64_t{1}, int64_t{10000}));
  app.add_option("--batch", batch)->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--lr", lr)->check(CLI::PositiveNumber);
  app.add_option("--seed", seed);
  app.add_option("--model", model, "fashion (the example's CNN, 421k parameters) or small (106k)")
      ->check(CLI::IsMember({"fashion", "small"}));
  app.add_option("--steps", steps, "steps per epoch and rank (0: the whole epoch)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--ddp", ddpMode, "join the Shoal job (shoal run) and train with DDP");
  app.add_flag("--no-malloc-tuning", noMallocTuning,
               "leave glibc malloc at its defaults (train/allocator.h not applied)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!noMallocTuning) train::keepFreedMemoryForReuse();
    std::optional<World> world;
    if (ddpMode) world = init();
    const int rank = world ? world->rank : 0, size = world ? world->size : 1;
    torch::set_num_threads(1);
    torch::manual_seed(seed);
    auto trainSet = train::readIdxDataset(train::kFashionMnistDir, "train");
    auto testSet = train::readIdxDataset(train::kFashionMnistDir, "t10k");
    auto net = makeModel(model);
    std::optional<train::DistributedDataParallel> ddp;
    if (world) ddp.emplace(net, world->group);
    auto opt = train::makeOptimizer(net->parameters(), {train::OptimizerKind::kAdam, lr});
    train::DistributedSampler sampler(trainSet.size(), rank, size, {.seed = seed});
    const int64_t stepsPerEpoch =
        steps > 0 ? std::min(steps, sampler.batches(batch)) : sampler.batches(batch);
    LrSchedule schedule(lr, size, false, 0, epochs * stepsPerEpoch);
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      auto order = sampler.indices(epoch);
      auto idxAll =
          torch::from_blob(order.data(), {static_cast<int64_t>(order.size())}, torch::kInt64);
      // Every rank starts the clock together and stops it when the last one is done.
      if (world) comm::barrier(*world->group);
      auto t0 = std::chrono::steady_clock::now();
      const double cpu0 = processCpuSeconds();
      const auto ddp0 = ddp ? ddp->stats() : train::DistributedDataParallel::Stats{};
      int64_t samples = 0;
      for (int64_t b = 0; b < stepsPerEpoch; ++b) {
        auto idx = idxAll.slice(0, b * batch, std::min<int64_t>((b + 1) * batch, order.size()));
        train::setLearningRate(*opt, schedule.at(step++));
        opt->zero_grad();
        if (ddp) ddp->beforeForward();
        auto loss =
            torch::nn::functional::cross_entropy(forward(net, trainSet.images.index_select(0, idx)),
                                                 trainSet.labels.index_select(0, idx));
        if (ddp) {
          ddp->backward(loss);
        } else {
          loss.backward();
        }
        opt->step();
        samples += idx.size(0);
      }
      // This rank's totals for the epoch, averaged over the ranks below.
      double perStep[3] = {processCpuSeconds() - cpu0, 0, 0};
      if (ddp) {
        perStep[1] = ddp->stats().bufferSeconds - ddp0.bufferSeconds;
        perStep[2] = ddp->stats().finishSeconds - ddp0.finishSeconds;
      }
      if (world) comm::barrier(*world->group);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (world) comm::allreduce(*world->group, perStep, 3, DataType::kFloat64, ReduceOp::kAvg);
      auto msPerStep = [&](double s) { return 1e3 * s / static_cast<double>(stepsPerEpoch); };
      torch::NoGradGuard noGrad;
      net->eval();
      // Each rank its share of the test set; the counts summed.
      int64_t counts[2] = {0, samples};
      for (int64_t at = rank * 250; at < testSet.size(); at += 250 * size) {
        auto x = testSet.images.slice(0, at, std::min<int64_t>(at + 250, testSet.size()));
        auto y = testSet.labels.slice(0, at, std::min<int64_t>(at + 250, testSet.size()));
        counts[0] += forward(net, x).argmax(1).eq(y).sum().item<int64_t>();
      }
      if (world) comm::allreduce(*world->group, counts, 2, DataType::kInt64, ReduceOp::kSum);
      net->train();
      if (rank == 0) {
        nlohmann::json row{{"epoch", epoch + 1},
                           {"ranks", size},
                           {"model", model},
                           {"malloc_tuning", !noMallocTuning},
                           {"epoch_seconds", seconds},
                           {"samples_per_second", counts[1] / seconds},
                           {"test_accuracy", double(counts[0]) / testSet.size()},
                           {"cpu_ms_per_step", msPerStep(perStep[0])}};
        if (ddp) {
          row["buffers_ms_per_step"] = msPerStep(perStep[1]);
          row["finish_ms_per_step"] = msPerStep(perStep[2]);
        }
        std::printf("%s\n", row.dump().c_str());
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plain_train: %s\n", e.what());
    return 1;
  }
}
