// Fashion-MNIST through train::Trainer (train/trainer.h): the model and the data are all this
// file holds; the strategy is a flag.
//
//   shoal run -n 2 -- trainer_mnist --strategy ddp
//   shoal run -n 2 -- trainer_mnist --strategy zero3 --accumulate 2 --clip 1
//   shoal run -n 2 --servers 1 -- trainer_mnist --strategy ps --ps-mode async
//
// Every worker prints nothing but rank 0 one line per epoch (loss, validation accuracy); with
// --metrics FILE rank 0 appends each epoch as a JSON line. Parameter-server ranks serve.
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "examples/numeric_flags.h"
#include "ps/server.h"
#include "run/init.h"
#include "train/idx_dataset.h"
#include "train/trainer.h"

using namespace shoal;

namespace {

struct Flags {
  std::string strategy = "ddp";
  std::string optimizer = "adam";
  double lr = 1e-3;
  int64_t batch = 64;
  int64_t epochs = 2;
  int64_t accumulate = 1;
  double clip = 0;
  std::string precision = "fp32";
  int64_t warmupSteps = 0;
  bool cosine = false;
  int64_t seed = 1;
  int64_t threads = 1;
  std::string dataDir = train::kFashionMnistDir;
  int64_t trainSubset = 0;
  int64_t testSubset = 0;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  bool resume = false;
  std::string psMode = "sync";
  int64_t staleness = 2;
  std::string metrics;
};

// The model: one Sequential, so every strategy (ZeRO-3's units are its children) takes it as is.
torch::nn::Sequential makeModel() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 16, 3).padding(1)), BatchNorm2d(16), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(16, 32, 3).padding(1)), BatchNorm2d(32),
                    ReLU(), MaxPool2d(2), Flatten(), Linear(32 * 7 * 7, 128), ReLU(), Dropout(0.25),
                    Linear(128, 10));
}

train::TensorDataset load(const std::string& dir, const char* split, int64_t subset) {
  auto d = train::readIdxDataset(dir, split);
  if (subset > 0 && subset < d.size()) {
    d.images = d.images.slice(0, 0, subset);
    d.labels = d.labels.slice(0, 0, subset);
  }
  return {d.images, d.labels};
}

int trainMain(const Flags& f) {
  torch::set_num_threads(static_cast<int>(f.threads));
  World w = init();
  if (w.role == run::Role::kServer) {
    ps::ServerOptions o;  // the servers hold the state: theirs are the checkpoints
    o.replicas = w.psReplicas;
    o.checkpointDir = f.checkpointDir;
    o.checkpointEvery = f.checkpointEvery;
    o.resume = f.resume;
    ps::serve(*w.group, w.roleRank, w.numServers, w.size - w.numServers, o);
    return 0;
  }
  train::TrainerOptions o;
  o.strategy = train::parseStrategy(f.strategy);
  o.optimizer.kind = train::parseOptimizer(f.optimizer);
  o.optimizer.lr = f.lr;
  o.epochs = f.epochs;
  o.batch = f.batch;
  o.accumulate = f.accumulate;
  o.clipNorm = f.clip;
  o.precision = train::parsePrecision(f.precision);
  o.warmupSteps = f.warmupSteps;
  o.cosineDecay = f.cosine;
  o.seed = static_cast<uint64_t>(f.seed);
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = f.checkpointEvery;
  o.resume = f.resume;
  o.psMode = ps::parseMode(f.psMode);
  o.staleness = static_cast<int>(f.staleness);

  const auto trainSet = load(f.dataDir, "train", f.trainSubset);
  const auto testSet = load(f.dataDir, "t10k", f.testSubset);
  torch::manual_seed(static_cast<uint64_t>(f.seed));  // the same initial weights everywhere
  train::Trainer trainer({w.group, w.numServers, w.psReplicas}, makeModel(), train::crossEntropy,
                         o);

  // Rank 0 reports each epoch (a callback: the loop itself prints nothing).
  struct Report : train::Callback {
    bool lead;
    std::ofstream metrics;
    void onEpoch(const train::EpochMetrics& m) override {
      if (!lead) return;
      fmt::print(
          "epoch {}: step {}, train loss {:.4f}, validation loss {:.4f}, accuracy {:.2f}%, "
          "{:.1f} s\n",
          m.epoch + 1, m.step, m.trainLoss, m.validationLoss, 100 * m.validationAccuracy,
          m.seconds);
      std::fflush(stdout);
      if (metrics.is_open()) {
        metrics << nlohmann::json{{"epoch", m.epoch + 1},
                                  {"step", m.step},
                                  {"train_loss", m.trainLoss},
                                  {"validation_loss", m.validationLoss},
                                  {"test_accuracy", m.validationAccuracy},
                                  {"epoch_seconds", m.seconds}}
                       .dump()
                << "\n";
        metrics.flush();
        if (!metrics) SHOAL_THROW(SystemError, "--metrics: writing failed");
      }
    }
  };
  auto report = std::make_shared<Report>();
  report->lead = trainer.workers().rank() == 0;
  if (report->lead && !f.metrics.empty()) {
    report->metrics.open(f.metrics, std::ios::app);
    if (!report->metrics) SHOAL_THROW(InvalidArgument, "--metrics {}: cannot be opened", f.metrics);
  }
  trainer.addCallback(report);
  if (report->lead) {
    fmt::print(
        "trainer_mnist: strategy {} on {} workers{}, {} samples, batch {} x {} accumulated\n",
        f.strategy, trainer.workers().size(),
        w.numServers ? fmt::format(" and {} parameter servers", w.numServers) : "", trainSet.size(),
        f.batch, f.accumulate);
  }
  trainer.fit(trainSet, &testSet);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Fashion-MNIST with train::Trainer: the strategy is a flag"};
  examples::NumericFlags numbers;
  app.add_option("--strategy", f.strategy, "ddp, zero1, zero2, zero3 or ps")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd, adam, rmsprop, lamb or lars")
      ->capture_default_str();
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3, "learning rate");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "samples per rank per micro-batch");
  numbers.integer(app, "--epochs", f.epochs, 1, 10000, "epochs");
  numbers.integer(app, "--accumulate", f.accumulate, 1, 1 << 16, "micro-batches per step");
  numbers.number(app, "--clip", f.clip, 0, 1e9, "clip the gradients' L2 norm (0: off)");
  app.add_option("--precision", f.precision, "fp32 or bf16")->capture_default_str();
  numbers.integer(app, "--warmup-steps", f.warmupSteps, 0, int64_t{1} << 40, "warm-up steps");
  app.add_flag("--cosine", f.cosine, "cosine decay of the learning rate to zero");
  numbers.integer(app, "--seed", f.seed, 0, std::numeric_limits<int64_t>::max(), "random seed");
  numbers.integer(app, "--threads", f.threads, 1, 256, "intra-op threads per rank");
  app.add_option("--data-dir", f.dataDir)->capture_default_str();
  numbers.integer(app, "--train-subset", f.trainSubset, 0, int64_t{1} << 32, "0: all 60000");
  numbers.integer(app, "--test-subset", f.testSubset, 0, int64_t{1} << 32, "0: all 10000");
  app.add_option("--checkpoint-dir", f.checkpointDir, "sharded checkpoints (not ps)");
  numbers.integer(app, "--checkpoint-every", f.checkpointEvery, 0, int64_t{1} << 40,
                  "steps between checkpoints (0: each epoch's end)");
  app.add_flag("--resume", f.resume, "continue from the newest checkpoint (ps: the servers')");
  app.add_option("--ps-mode", f.psMode, "ps: sync, async or ssp")->capture_default_str();
  numbers.integer(app, "--staleness", f.staleness, 0, 1000000, "ps ssp: steps ahead allowed");
  app.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  return examples::runExample("trainer_mnist", app, numbers, argc, argv,
                              [&] { return trainMain(f); });
}
