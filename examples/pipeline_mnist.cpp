// Pipeline-parallel training of a deep residual MLP (train/residual_mlp.h) on Fashion-MNIST.
//
//   shoal run -n 2 -- build/pipeline_mnist --pipeline-stages 2 --micro-batches 8 --schedule 1f1b
//   shoal run -n 4 -- build/pipeline_mnist --pipeline-stages 2     # 2 replicas x 2 stages
//   build/pipeline_mnist --pipeline-stages 1                        # one process, no pipeline
//
// Each step takes a global batch (--batch, split over the replicas, then into micro-batches);
// the data order depends on --seed only, so every layout of the same global batch sees the same
// samples in the same steps and can be compared with one process. After each epoch the test
// accuracy is printed (evaluated through the pipeline, forward only).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>

#include "comm/collectives.h"
#include "common/error.h"
#include "examples/numeric_flags.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/idx_dataset.h"
#include "train/pipeline/pipeline.h"
#include "train/pipeline/stage_checkpoint.h"
#include "train/pipeline/trace.h"
#include "train/residual_mlp.h"

using namespace shoal;
namespace pp = shoal::train::pipeline;

namespace {

struct Flags {
  int stages = 0;  // 0: the world size
  int microBatches = 8;
  std::string schedule = "1f1b";
  int chunks = 0;  // 0: 2 for interleaved, else 1
  std::string split = "time";
  std::vector<int> boundaries;
  bool checkpointActivations = false;
  int64_t batch = 256;
  int64_t epochs = 1;
  int64_t steps = 0;  // per epoch, 0: all
  double lr = 0.05;
  int64_t blocks = 12;
  int64_t hidden = 256;
  int64_t seed = 1;
  int64_t trainSubset = 0;
  std::string dataDir = train::kFashionMnistDir;
  std::string trace;
  std::string checkpointDir;
  bool resume = false;
};

torch::Tensor crossEntropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// The permutation of epoch e: the same on every rank and for every layout.
torch::Tensor order(int64_t n, int64_t seed, int64_t epoch) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed * 1000003 + epoch));
  return torch::randperm(n, gen);
}

int trainMain(const Flags& f) {
  auto world = shoal::init();
  torch::set_num_threads(1);
  train::keepFreedMemoryForReuse();
  const int stages = f.stages == 0 ? world.size : f.stages;
  auto trainSet = train::readIdxDataset(f.dataDir, "train");
  auto testSet = train::readIdxDataset(f.dataDir, "t10k");
  const int64_t n = f.trainSubset > 0 ? std::min(f.trainSubset, trainSet.size()) : trainSet.size();
  torch::manual_seed(static_cast<uint64_t>(f.seed));
  auto net = train::residualMlp(f.blocks, f.hidden);
  const bool lead = world.rank == 0;

  // One process: the same model, data and steps without a pipeline (the reference).
  const bool plain = stages == 1 && world.size == 1;
  std::unique_ptr<pp::Pipeline> pipe;
  std::optional<pp::Grid> grid;
  if (!plain) {
    grid = pp::makeGrid(world.group, stages);
    pp::PipelineOptions o;
    o.schedule = f.schedule;
    o.microBatches = f.microBatches;
    o.chunks = f.chunks > 0 ? f.chunks : (f.schedule == "interleaved" ? 2 : 1);
    o.split = f.split == "time" ? pp::SplitMethod::kTime : pp::SplitMethod::kParameters;
    if (!f.boundaries.empty()) {
      o.split = pp::SplitMethod::kBoundaries;
      o.boundaries = f.boundaries;
    }
    o.checkpointActivations = f.checkpointActivations;
    const int64_t micro = std::max<int64_t>(1, f.batch / grid->replicas / f.microBatches);
    pipe = std::make_unique<pp::Pipeline>(net, *grid, trainSet.images.narrow(0, 0, micro),
                                          crossEntropy, o);
  }
  auto params = plain ? net->parameters() : pipe->parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(f.lr).momentum(0.9));
  const int replicas = plain ? 1 : grid->replicas;
  SHOAL_CHECK(f.batch % replicas == 0, "--batch {} does not split over {} replicas", f.batch,
              replicas);
  std::unique_ptr<pp::StageCheckpointer> checkpoints;
  int64_t firstStep = 0;
  if (!f.checkpointDir.empty()) {
    SHOAL_CHECK(!plain,
                "--checkpoint-dir is for pipelines (fashion_mnist checkpoints one "
                "process)");
    checkpoints = std::make_unique<pp::StageCheckpointer>(f.checkpointDir, 3, *pipe);
    if (f.resume) {
      if (auto p = checkpoints->resumeLatest(opt)) firstStep = p->step;
      if (lead) fmt::print("resumed at step {}\n", firstStep);
    }
  }
  const int64_t perEpoch = f.steps > 0 ? std::min(f.steps, n / f.batch) : n / f.batch;
  const int64_t share = f.batch / replicas;
  const int replica = plain ? 0 : grid->replica;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < f.epochs; ++epoch) {
    auto perm = order(n, f.seed, epoch);
    double lossSum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < perEpoch; ++b, ++step) {
      if (step < firstStep) continue;
      auto idx = perm.narrow(0, b * f.batch + replica * share, share);
      auto x = trainSet.images.index_select(0, idx), y = trainSet.labels.index_select(0, idx);
      opt.zero_grad();
      torch::Tensor loss;
      if (plain) {
        loss = crossEntropy(net->forward(x), y);
        loss.backward();
      } else {
        loss = pipe->step(x, y);
      }
      opt.step();
      lossSum += loss.item<double>();
      if (checkpoints && (step + 1) % 50 == 0) {
        train::Progress p;
        p.step = step + 1;
        checkpoints->save(opt, p);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Test accuracy, through the pipeline (forward only): each replica takes every replicas-th
    // slice of 1000, counted on its last stage and summed over the world.
    int64_t correct = 0;
    for (int64_t at = static_cast<int64_t>(replica) * 1000; at < testSet.size();
         at += 1000 * static_cast<int64_t>(replicas)) {
      const int64_t len = std::min<int64_t>(1000, testSet.size() - at);
      auto x = testSet.images.narrow(0, at, len);
      torch::Tensor out;
      if (plain) {
        torch::NoGradGuard g;
        out = net->forward(x);
      } else {
        out = pipe->predict(x);
      }
      if (out.defined()) {
        correct += out.argmax(1).eq(testSet.labels.narrow(0, at, len)).sum().item<int64_t>();
      }
    }
    if (!plain) {
      comm::allreduce(*world.group, &correct, 1, DataType::kInt64, ReduceOp::kSum);
      // Each replica's loss is the mean over its equal share: their average is the batch's.
      comm::allreduce(*world.group, &lossSum, 1, DataType::kFloat64, ReduceOp::kAvg);
    }
    const double accuracy = static_cast<double>(correct) / static_cast<double>(testSet.size());
    if (lead) {
      fmt::print("epoch {}: mean loss {:.4f}, test accuracy {:.2f}%, {:.0f} samples/s\n", epoch + 1,
                 lossSum / static_cast<double>(std::max<int64_t>(perEpoch, 1)), 100 * accuracy,
                 static_cast<double>(perEpoch * f.batch) / seconds);
      std::cout << std::flush;
    }
  }
  if (!f.trace.empty() && pipe) {
    pp::writeChromeTrace(*world.group, grid->stage, pipe->lastTrace(), f.trace);
    if (lead) fmt::print("trace of the last step: {}\n", f.trace);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shoal pipeline-parallel training on Fashion-MNIST"};
  Flags f;
  examples::NumericFlags numbers;
  numbers.integer(app, "--pipeline-stages", f.stages, 0, 4096,
                  "ranks per pipeline (0: the world size); world = replicas x stages");
  numbers.integer(app, "--micro-batches", f.microBatches, 1, 1 << 16, "micro-batches per step");
  app.add_option("--schedule", f.schedule, "gpipe, 1f1b or interleaved")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  numbers.integer(app, "--chunks", f.chunks, 0, 64,
                  "model chunks per rank (interleaved; 0: 2 for interleaved, else 1)");
  app.add_option("--split", f.split, "balance stages by measured time or by parameters")
      ->capture_default_str()
      ->check(CLI::IsMember({"time", "parameters"}));
  app.add_option("--boundaries", f.boundaries,
                 "split by hand: the first layer of each stage after the first (e.g. 7 or 4,8,12)")
      ->delimiter(',');
  app.add_flag("--checkpoint-activations", f.checkpointActivations,
               "keep only stage inputs; recompute the forward during backward");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "global batch (all replicas)");
  numbers.integer(app, "--epochs", f.epochs, 1, 10000, "epochs");
  numbers.integer(app, "--steps", f.steps, 0, int64_t{1} << 40, "steps per epoch (0: all)");
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3, "learning rate");
  numbers.integer(app, "--blocks", f.blocks, 1, 4096, "residual blocks");
  numbers.integer(app, "--hidden", f.hidden, 1, 1 << 16, "width");
  numbers.integer(app, "--seed", f.seed, 0, int64_t{1} << 40, "seed (model and data order)");
  numbers.integer(app, "--train-subset", f.trainSubset, 0, int64_t{1} << 32,
                  "first N training samples only (0: all)");
  app.add_option("--data-dir", f.dataDir)->capture_default_str();
  app.add_option("--trace", f.trace, "write the last step's timeline (Chrome trace JSON)");
  app.add_option("--checkpoint-dir", f.checkpointDir, "a shard per stage every 50 steps");
  app.add_flag("--resume", f.resume, "continue from the newest checkpoint every stage has");
  return examples::runExample("pipeline_mnist", app, numbers, argc, argv,
                              [&] { return trainMain(f); });
}
