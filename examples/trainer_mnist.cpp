// Fashion-MNIST through train::Trainer (train/trainer.h): the model and the data are all this
// file holds; the strategy is a flag.
//
//   shoal run -n 2 -- trainer_mnist --strategy ddp
//   shoal run -n 2 -- trainer_mnist --strategy zero3 --accumulate 2 --clip 1
//   shoal run -n 2 --servers 1 -- trainer_mnist --strategy ps --ps-mode async
//   shoal run -n 4 -- trainer_mnist --strategy pipeline --stages 2 --micro-batches 4
//   shoal run -n 4 -- trainer_mnist --strategy hybrid --stages 2 --tensor 2
//   shoal run -n 2 -- trainer_mnist --optimizer adamw --weight-decay 0.01 --validate-every 50
//   shoal run -n 2 -- trainer_mnist --strategy ddp --compression powersgd:2,warmup=10
//   shoal run -n 2 -- trainer_mnist --strategy zero2 --save model.pt  # the whole model, one file
//   trainer_mnist --evaluate-from model.pt                            # ... run by one process
//
// Every worker prints nothing but rank 0 one line per epoch (loss, validation accuracy) and, with
// --validate-every, one per validation; with --metrics FILE rank 0 appends each epoch as a JSON
// line. Parameter-server ranks serve.
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "examples/numeric_flags.h"
#include "ps/server.h"
#include "run/init.h"
#include "train/full_state.h"
#include "train/idx_dataset.h"
#include "train/tensor/column_linear.h"
#include "train/tensor/row_linear.h"
#include "train/tensor/sharded_dropout.h"
#include "train/trainer.h"

using namespace shoal;

namespace {

struct Flags {
  std::string strategy = "ddp";
  std::string optimizer = "adam";
  double lr = 1e-3;
  double momentum = 0.9;  // sgd, rmsprop, lars
  double weightDecay = 0;
  int64_t batch = 64;
  int64_t epochs = 2;
  int64_t steps = 0;  // per epoch, 0: all
  int64_t validateEvery = 0;
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
  int64_t stages = 1;
  int64_t tensor = 1;
  int64_t microBatches = 4;
  int64_t chunks = 1;
  std::string schedule = "1f1b";
  double dropout = 0.25;
  std::string metrics;
  std::string compression = "none";
  bool noOverlap = false;
  std::string save;
  std::string evaluateFrom;
};

// The model: one Sequential, so every strategy takes it as is (ZeRO-3's units and a pipeline's
// stages are its children). Its classifier is split over the grid's tensor-parallel ranks (a
// column-parallel layer feeding a row-parallel one, Megatron's MLP); under the other strategies
// that group has one rank and they compute as torch::nn::Linear does. The dropout between them
// acts on the split activation, so each tensor rank draws its own mask (sharded_dropout.h).
torch::nn::Sequential makeModel(const train::ProcessGrid& grid, double dropout) {
  using namespace torch::nn;
  const train::tensor::TensorGroup tg{grid.tensor};
  // The full layers, the same on every rank (the Trainer seeded libtorch): each rank keeps its
  // slice.
  Linear hidden(32 * 7 * 7, 128), out(128, 10);
  return Sequential(Conv2d(Conv2dOptions(1, 16, 3).padding(1)), BatchNorm2d(16), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(16, 32, 3).padding(1)), BatchNorm2d(32),
                    ReLU(), MaxPool2d(2), Flatten(),
                    train::tensor::ColumnParallelLinear(hidden->weight, hidden->bias, tg), ReLU(),
                    train::tensor::ShardedDropout(dropout, tg),
                    train::tensor::RowParallelLinear(out->weight, out->bias, tg));
}

train::TensorDataset load(const std::string& dir, const char* split, int64_t subset) {
  const auto d = train::readIdxDataset(dir, split, subset);
  return {d.images, d.labels};
}

int trainMain(const Flags& f) {
  torch::set_num_threads(static_cast<int>(f.threads));
  World w = init();
  if (w.role == run::Role::kServer) {
    ps::ServerOptions o;  // the servers hold the state: theirs are the checkpoints
    o.replicas = w.psReplicas;
    o.replacement = w.psReplacement > 0;  // shoal run --ps-replacements
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
  o.optimizer.momentum = f.momentum;
  o.optimizer.weightDecay = f.weightDecay;
  o.epochs = f.epochs;
  o.stepsPerEpoch = f.steps;
  o.validateEvery = f.validateEvery;
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
  // One flag for both: the all-reduce's hook (ddp, zero1) or the parameter-server client's.
  const auto compression = compress::CompressionSpec::parse(f.compression);
  (o.strategy == train::Strategy::kParameterServer ? o.psClient.compression : o.compression) =
      compression;
  o.overlap = !f.noOverlap;
  o.staleness = static_cast<int>(f.staleness);
  o.pipelineStages = static_cast<int>(f.stages);
  o.tensorParallel = static_cast<int>(f.tensor);
  o.pipeline.microBatches = static_cast<int>(f.microBatches);
  o.pipeline.chunks = static_cast<int>(f.chunks);
  o.pipeline.schedule = f.schedule;

  const auto trainSet = load(f.dataDir, "train", f.trainSubset);
  const auto testSet = load(f.dataDir, "t10k", f.testSubset);
  train::Trainer trainer(
      {w.group, w.numServers, w.psReplicas, w.elastic},
      [&](const train::ProcessGrid& grid) { return makeModel(grid, f.dropout); },
      train::crossEntropy, o);

  // Rank 0 reports each epoch (a callback: the loop itself prints nothing); in an elastic job,
  // rank 0 of the current view (the lead may change).
  struct Report : train::Callback {
    train::Trainer* trainer;
    bool everyValidation;
    std::string metricsPath;
    std::ofstream metrics;
    bool lead() const { return trainer->workers().rank() == 0; }
    void onValidation(const train::EpochMetrics& m) override {
      if (!lead() || !everyValidation) return;
      fmt::print(
          "validation at step {}: train loss {:.4f}, validation loss {:.4f}, perplexity {:.4f}, "
          "accuracy {:.2f}%\n",
          m.step, m.trainLoss, m.validationLoss, m.validationPerplexity,
          100 * m.validationAccuracy);
      std::fflush(stdout);
    }
    int64_t jobSamples = 0;  // this epoch's, every replica's (what a samples/s rate counts)
    void onStep(const train::StepInfo& s) override { jobSamples += s.jobSamples; }
    void onEpoch(const train::EpochMetrics& m) override {
      const int64_t samples = std::exchange(jobSamples, 0);
      if (!lead()) return;
      fmt::print(
          "epoch {}: step {}, train loss {:.4f}, validation loss {:.4f}, accuracy {:.2f}%, "
          "{:.1f} s, {} samples trained by the job\n",
          m.epoch + 1, m.step, m.trainLoss, m.validationLoss, 100 * m.validationAccuracy, m.seconds,
          samples);
      std::fflush(stdout);
      if (!metricsPath.empty()) {
        if (!metrics.is_open()) metrics.open(metricsPath, std::ios::app);  // a new lead's
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
  report->trainer = &trainer;
  report->everyValidation = f.validateEvery > 0;
  report->metricsPath = f.metrics;
  if (report->lead() && !f.metrics.empty()) {
    report->metrics.open(f.metrics, std::ios::app);
    if (!report->metrics) SHOAL_THROW(InvalidArgument, "--metrics {}: cannot be opened", f.metrics);
  }
  trainer.addCallback(report);
  // A traced job re-measures the clocks after each epoch, so the timeline stays aligned however
  // long it runs (README "Timeline"). Not with parameter servers, which do not take part, nor in
  // an elastic job: the measurement is collective over the launch's world, which a view change
  // leaves behind.
  if (w.trace && w.numServers == 0 && !w.elastic) {
    struct Resync : train::Callback {
      std::shared_ptr<run::TraceSession> trace;
      void onEpoch(const train::EpochMetrics&) override { trace->resync(); }
    };
    auto resync = std::make_shared<Resync>();
    resync->trace = w.trace;
    trainer.addCallback(resync);
  }
  if (report->lead()) {
    fmt::print(
        "trainer_mnist: strategy {} on {} workers{}, {} samples, batch {} x {} accumulated{}\n",
        f.strategy, trainer.workers().size(),
        w.numServers ? fmt::format(" and {} parameter servers", w.numServers) : "", trainSet.size(),
        f.batch, f.accumulate, trainer.grid() ? "; " + trainer.grid()->describe() : "");
  }
  trainer.fit(trainSet, &testSet);
  if (!f.save.empty()) {
    // Collective: every worker takes part in the gather; the lead (of the last view) writes.
    const train::FullState state = trainer.gatherFullState();
    if (report->lead()) {
      train::writeFullState(f.save, state);
      fmt::print("saved the full model to {} (run it in one process with --evaluate-from)\n",
                 f.save);
    }
  }
  return 0;
}

// One process, no job: the saved model on the test set, in evaluation mode (BatchNorm's saved
// running statistics, no dropout), as the Trainer's validation computes it.
int evaluateMain(const Flags& f) {
  torch::set_num_threads(static_cast<int>(f.threads));
  auto model = makeModel(train::ProcessGrid{}, f.dropout);
  train::loadFullState(*model, train::readFullState(f.evaluateFrom));
  model->eval();
  const auto test = load(f.dataDir, "t10k", f.testSubset);
  torch::NoGradGuard noGrad;
  int64_t correct = 0;
  for (int64_t at = 0; at < test.size(); at += 256) {
    const int64_t n = std::min<int64_t>(256, test.size() - at);
    const auto out = model->forward(test.inputs.narrow(0, at, n));
    correct += out.argmax(1).eq(test.targets.narrow(0, at, n)).sum().item<int64_t>();
  }
  fmt::print("{}: accuracy {:.2f}% on {} samples\n", f.evaluateFrom,
             100.0 * static_cast<double>(correct) / static_cast<double>(test.size()), test.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Fashion-MNIST with train::Trainer: the strategy is a flag"};
  examples::NumericFlags numbers;
  app.add_option("--strategy", f.strategy,
                 "ddp, zero1, zero2, zero3, ps, pipeline, tensor or hybrid")
      ->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd, adam, adamw, rmsprop, lamb or lars")
      ->capture_default_str();
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3, "learning rate");
  numbers.number(app, "--momentum", f.momentum, 0, 0.999,
                 "sgd, rmsprop, lars: momentum (0 with a --compression that has its own)");
  numbers.number(app, "--weight-decay", f.weightDecay, 0, 1e3,
                 "weight decay (adamw: decoupled; the others: added to the gradient)");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "samples per rank per micro-batch");
  numbers.integer(app, "--epochs", f.epochs, 1, 10000, "epochs");
  numbers.integer(app, "--steps", f.steps, 0, int64_t{1} << 40,
                  "optimizer steps per epoch at most (0: every batch)");
  numbers.integer(app, "--validate-every", f.validateEvery, 0, int64_t{1} << 40,
                  "also validate every N optimizer steps (0: only after each epoch)");
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
  numbers.integer(app, "--stages", f.stages, 1, 1024, "pipeline, hybrid: pipeline stages");
  numbers.integer(app, "--tensor", f.tensor, 1, 1024, "tensor, hybrid: tensor-parallel ranks");
  numbers.integer(app, "--chunks", f.chunks, 1, 1024,
                  "pipeline, hybrid: model chunks per rank (interleaved: 2 or more)");
  numbers.integer(app, "--micro-batches", f.microBatches, 1, 1 << 16,
                  "pipeline, hybrid: micro-batches per step");
  numbers.number(app, "--dropout", f.dropout, 0, 0.99, "dropout before the last layer");
  app.add_option("--schedule", f.schedule, "pipeline, hybrid: gpipe, 1f1b or interleaved")
      ->capture_default_str();
  app.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  app.add_option("--compression", f.compression,
                 "gradient compression (ddp, zero1, ps): none, fp16, bf16, topk:DENSITY, "
                 "powersgd:RANK, onebit; optionally ,momentum=M (topk, onebit; with "
                 "--optimizer sgd --momentum 0) and ,warmup=STEPS")
      ->capture_default_str();
  app.add_flag("--no-overlap", f.noOverlap, "ddp: all-reduce after backward, not during it");
  app.add_option("--save", f.save,
                 "after training, write the whole model here (ddp, zero1, zero2 and the grid "
                 "strategies; a sealed file)");
  app.add_option("--evaluate-from", f.evaluateFrom,
                 "no training: load a --save file in this one process and report its test "
                 "accuracy");
  return examples::runExample("trainer_mnist", app, numbers, argc, argv, [&] {
    return f.evaluateFrom.empty() ? trainMain(f) : evaluateMain(f);
  });
}
