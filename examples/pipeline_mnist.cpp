// Pipeline-parallel training of a deep residual MLP (train/residual_mlp.h) on Fashion-MNIST,
// through train::Trainer (train/trainer.h): this file holds the model, the data and the flags.
//
//   shoal run -n 2 -- build/pipeline_mnist --pipeline-stages 2 --micro-batches 8 --schedule 1f1b
//   shoal run -n 4 -- build/pipeline_mnist --pipeline-stages 2     # 2 replicas x 2 stages
//   build/pipeline_mnist --pipeline-stages 1                        # one process, no pipeline
//
// Each step takes a global batch (--batch, split over the replicas, then into micro-batches);
// the data order depends on --seed only, so every pipeline layout of the same global batch sees
// the same samples in the same steps and can be compared with one process. After each epoch the
// test accuracy is printed (evaluated through the pipeline, forward only).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>

#include "common/error.h"
#include "examples/numeric_flags.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/idx_dataset.h"
#include "train/pipeline/trace.h"
#include "train/residual_mlp.h"
#include "train/trainer.h"

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

train::TensorDataset load(const std::string& dir, const char* split, int64_t subset) {
  const auto d = train::readIdxDataset(dir, split, subset);
  return {d.images, d.labels};
}

// Rank 0's line per epoch. Throughput is of the steps after the epoch's first (which would
// count the pipeline's planning), up to its last, before its validation.
struct Report : train::Callback {
  bool lead = false;
  int64_t batch = 0;
  int64_t steps = 0;
  std::chrono::steady_clock::time_point first, last;

  void onStep(const train::StepInfo&) override {
    last = std::chrono::steady_clock::now();
    if (steps++ == 0) first = last;
  }
  void onEpoch(const train::EpochMetrics& m) override {
    const double seconds = std::chrono::duration<double>(last - first).count();
    if (lead) {
      fmt::print("epoch {}: mean loss {:.4f}, test accuracy {:.2f}%, {:.0f} samples/s\n",
                 m.epoch + 1, m.trainLoss, 100 * m.validationAccuracy,
                 seconds > 0 ? static_cast<double>((steps - 1) * batch) / seconds : 0.0);
      std::fflush(stdout);
    }
    steps = 0;
  }
};

int trainMain(const Flags& f) {
  auto world = shoal::init();
  torch::set_num_threads(1);
  train::keepFreedMemoryForReuse();
  const int stages = f.stages == 0 ? world.size : f.stages;
  SHOAL_CHECK(stages >= 1 && world.size % stages == 0,
              "--pipeline-stages {} does not divide the world of {}", stages, world.size);
  const int replicas = world.size / stages;
  SHOAL_CHECK(f.batch % replicas == 0, "--batch {} does not split over {} replicas", f.batch,
              replicas);
  SHOAL_CHECK(f.trace.empty() || stages > 1,
              "--trace writes the pipeline's timeline: it needs --pipeline-stages >= 2");

  train::TrainerOptions o;
  // One stage: the same model, data and steps without a pipeline (the reference), data
  // parallel over the world.
  o.strategy = stages > 1 ? train::Strategy::kPipeline : train::Strategy::kDdp;
  o.pipelineStages = stages;
  o.optimizer = {.kind = train::OptimizerKind::kSgd, .lr = f.lr, .momentum = 0.9};
  o.epochs = f.epochs;
  o.stepsPerEpoch = f.steps;
  o.batch = f.batch / replicas;
  o.seed = static_cast<uint64_t>(f.seed);
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = 50;
  o.keep = 3;
  o.resume = f.resume;
  o.pipeline.schedule = f.schedule;
  o.pipeline.microBatches = f.microBatches;
  o.pipeline.chunks = f.chunks > 0 ? f.chunks : (f.schedule == "interleaved" ? 2 : 1);
  o.pipeline.split = f.split == "time" ? pp::SplitMethod::kTime : pp::SplitMethod::kParameters;
  if (!f.boundaries.empty()) {
    o.pipeline.split = pp::SplitMethod::kBoundaries;
    o.pipeline.boundaries = f.boundaries;
  }
  o.pipeline.checkpointActivations = f.checkpointActivations;

  const auto trainSet = load(f.dataDir, "train", f.trainSubset);
  const auto testSet = load(f.dataDir, "t10k", 0);
  train::Trainer trainer(
      {world.group},
      [&](const train::ProcessGrid&) { return train::residualMlp(f.blocks, f.hidden); },
      train::crossEntropy, o);
  auto report = std::make_shared<Report>();
  report->lead = world.rank == 0;
  report->batch = f.batch;
  trainer.addCallback(report);
  trainer.fit(trainSet, &testSet);

  if (!f.trace.empty()) {
    pp::Pipeline* pipe = trainer.pipeline();
    pp::writeChromeTrace(trainer.workers(), pipe->grid().stage, pipe->lastTrace(), f.trace);
    if (world.rank == 0) fmt::print("trace of the last step: {}\n", f.trace);
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
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3, "learning rate (SGD, momentum 0.9)");
  numbers.integer(app, "--blocks", f.blocks, 1, 4096, "residual blocks");
  numbers.integer(app, "--hidden", f.hidden, 1, 1 << 16, "width");
  numbers.integer(app, "--seed", f.seed, 0, int64_t{1} << 40, "seed (model and data order)");
  numbers.integer(app, "--train-subset", f.trainSubset, 0, int64_t{1} << 32,
                  "first N training samples only (0: all)");
  app.add_option("--data-dir", f.dataDir)->capture_default_str();
  app.add_option("--trace", f.trace, "write the last step's timeline (Chrome trace JSON)");
  app.add_option("--checkpoint-dir", f.checkpointDir,
                 "sharded checkpoints every 50 steps and at each epoch's end");
  app.add_flag("--resume", f.resume, "continue from the newest checkpoint");
  return examples::runExample("pipeline_mnist", app, numbers, argc, argv,
                              [&] { return trainMain(f); });
}
