// A small GPT-style byte-level language model (train/gpt.h) trained on Debian's fortune files
// (train/byte_corpus.h) by train::Trainer on a data x pipeline x tensor process grid, then asked
// to write. This file holds the model, the data and the report; the Trainer the loop.
//
//   build/gpt_fortunes                                            # one process
//   shoal run -n 2 -- build/gpt_fortunes --tensor-parallel 2
//   shoal run -n 8 -- build/gpt_fortunes --tensor-parallel 2 --pipeline-stages 2 --data-parallel 2
//   build/gpt_fortunes --generate-from model.pt --prompt "Q: "    # a saved model, one process
//
// Every rank builds the same full model from --seed and keeps its slices; every rank reads the
// same global batches (--batch, split over the data replicas): any grid shape follows the same
// loss curve as one process, up to float rounding. The training windows are drawn up front,
// --steps global batches of them, and each taken once in an order shuffled by --seed. The loss
// and the validation perplexity are printed every --eval-every steps and at the end; then the
// model is gathered (--save writes it, a sealed file loadable by one process) and world rank 0
// generates --generate bytes from --prompt.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "common/error.h"
#include "examples/numeric_flags.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/byte_corpus.h"
#include "train/full_state.h"
#include "train/gpt.h"
#include "train/trainer.h"

using namespace shoal;

namespace {

struct Flags {
  int tensor = 1;
  int pipeline = 1;
  int data = 0;  // 0: world / (pipeline x tensor)
  std::string order = "tensor,pipeline,data";
  int microBatches = 4;
  std::string schedule = "1f1b";
  int64_t steps = 300;
  int64_t batch = 32;
  int64_t sequence = 64;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  double lr = 1e-3;  // 3e-3 stalls near the unigram loss for ~200 steps at this batch
  int64_t seed = 1;
  int64_t evalEvery = 100;
  int64_t evalBatches = 4;
  int64_t generate = 200;
  double temperature = 0.8;
  std::string prompt = "The ";
  std::string corpus = "/usr/share/games/fortunes";
  std::string save;
  std::string generateFrom;
  std::string checkpointDir;
  int64_t checkpointEvery = 100;
  std::string precision = "fp32";
  bool resume = false;
};

train::GptConfig configOf(const Flags& f) {
  return {.vocabulary = train::ByteCorpus::kVocabSize,
          .sequence = f.sequence,
          .hidden = f.hidden,
          .heads = f.heads,
          .layers = f.layers,
          .seed = static_cast<uint64_t>(f.seed)};
}

// Samples `count` bytes after `prompt` from a one-process model (the last --sequence bytes are
// the context), with a generator seeded from --seed so that a run is repeatable.
std::string generate(torch::nn::Sequential& model, const train::GptConfig& c, const Flags& f) {
  torch::NoGradGuard noGrad;
  std::vector<int64_t> tokens(f.prompt.begin(), f.prompt.end());
  for (auto& t : tokens) t &= 0xff;
  if (tokens.empty()) tokens.push_back('\n');
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(f.seed) + 17);
  train::tensor::TensorGroup one;
  for (int64_t i = 0; i < f.generate; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), c.sequence);
    torch::Tensor context =
        torch::tensor(std::vector<int64_t>(tokens.end() - n, tokens.end())).unsqueeze(0);
    torch::Tensor logits = model->forward(context).select(1, n - 1).squeeze(0);
    torch::Tensor probs = torch::softmax(logits / std::max(f.temperature, 1e-3), -1);
    tokens.push_back(torch::multinomial(probs, 1, false, gen).item<int64_t>());
  }
  return train::ByteCorpus::decode(torch::tensor(tokens));
}

int generateOnly(const Flags& f) {
  const train::GptConfig c = configOf(f);
  auto model = train::makeGpt(c, train::tensor::TensorGroup{});
  train::loadFullState(*model, train::readFullState(f.generateFrom));
  fmt::print("{}\n", generate(model, c, f));
  return 0;
}

// The data: every step's global batch of windows, drawn as ByteCorpus draws them and held in
// memory as one data set (8 x (sequence + 1) bytes a window), whose next-byte targets are the
// inputs shifted by one.
train::TensorDataset windows(const train::ByteCorpus& corpus, train::ByteCorpus::Split split,
                             int64_t batches, const Flags& f) {
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < batches; ++b) {
    parts.push_back(corpus.batch(f.batch, f.sequence, static_cast<uint64_t>(b), split));
  }
  const torch::Tensor all = torch::cat(parts);
  return {all.narrow(1, 0, f.sequence), all.narrow(1, 1, f.sequence)};
}

// Rank 0's line per validation: the mean training loss since the previous one, the validation
// loss and perplexity, and the tokens per second of the steps between.
struct Report : train::Callback {
  bool lead = false;
  bool resumed = false;
  int64_t tokensPerStep = 0;
  int64_t steps = 0;  // since the previous validation
  bool first = true;
  void onStep(const train::StepInfo& s) override {
    // The first step after a resume says where the checkpoint left off.
    if (lead && resumed && first) fmt::print("resumed at step {}\n", s.step - 1);
    first = false;
    ++steps;
  }
  void onValidation(const train::EpochMetrics& m) override {
    if (lead) {
      fmt::print(
          "step {}: loss {:.4f}, validation loss {:.4f}, perplexity {:.2f}, {:.0f} tokens/s\n",
          m.step, m.trainLoss, m.validationLoss, m.validationPerplexity,
          static_cast<double>(steps * tokensPerStep) / m.seconds);
      std::fflush(stdout);
    }
    steps = 0;
  }
};

int trainMain(const Flags& f) {
  auto world = shoal::init();
  torch::set_num_threads(1);
  // glibc would hand freed activation memory back to the kernel every step and fault it in
  // again: a step takes 1.7x as long without this (bench/results/tensor_parallel.md).
  train::keepFreedMemoryForReuse();
  const bool lead = world.rank == 0;
  const train::GptConfig c = configOf(f);
  // Every rank checks the model and the batch against the grid before any group is split or
  // layer built.
  train::validate(c, f.tensor, f.pipeline);
  const int data = f.data > 0 ? f.data : world.size / std::max(1, f.pipeline * f.tensor);
  SHOAL_CHECK(data * f.pipeline * f.tensor == world.size,
              "--data-parallel {} x --pipeline-stages {} x --tensor-parallel {} is not the "
              "world's {} ranks",
              data, f.pipeline, f.tensor, world.size);
  if (f.batch % data != 0 || (f.pipeline > 1 && f.batch / data < f.microBatches)) {
    SHOAL_THROW(InvalidArgument,
                "--batch {} must divide over data {} into at least --micro-batches {} each",
                f.batch, data, f.microBatches);
  }
  train::ByteCorpus corpus({.directory = f.corpus, .seed = static_cast<uint64_t>(f.seed)});
  const auto trainSet = windows(corpus, train::ByteCorpus::Split::kTrain, f.steps, f);
  const auto validationSet =
      windows(corpus, train::ByteCorpus::Split::kValidation, f.evalBatches, f);

  // The hybrid strategy on whatever grid the flags give, one process included: the same
  // program, and the same losses up to rounding.
  train::TrainerOptions o;
  o.strategy = train::Strategy::kHybrid;
  o.pipelineStages = f.pipeline;
  o.tensorParallel = f.tensor;
  o.gridOrder = f.order;
  o.optimizer = {.kind = train::OptimizerKind::kAdamW, .lr = f.lr, .weightDecay = 0.01};
  o.epochs = 1;
  o.stepsPerEpoch = f.steps;
  o.batch = f.batch / data;
  o.seed = static_cast<uint64_t>(f.seed);
  o.precision = train::parsePrecision(f.precision);
  o.validateEvery = f.evalEvery;
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = f.checkpointEvery;
  o.keep = 3;
  o.resume = f.resume;
  o.pipeline.schedule = f.schedule;
  o.pipeline.microBatches = f.microBatches;
  o.pipeline.chunks = f.schedule == "interleaved" ? 2 : 1;
  train::Trainer trainer(
      {world.group},
      [&](const train::ProcessGrid& grid) { return train::makeGpt(c, {grid.tensor}); },
      [&](const torch::Tensor& out, const torch::Tensor& y, const train::ProcessGrid& grid) {
        return train::gptLoss(out, y, c, {grid.tensor});
      },
      o);
  if (lead) fmt::print("{}\nmodel: {}\n", trainer.grid()->describe(), c.describe());
  auto report = std::make_shared<Report>();
  report->lead = lead;
  report->resumed = f.resume;
  report->tokensPerStep = f.batch * c.sequence;
  trainer.addCallback(report);
  trainer.fit(trainSet, &validationSet);

  const train::LossScaler* scaler = trainer.lossScaler();
  if (lead && scaler && scaler->enabled()) {
    fmt::print("loss scaling: {} of {} steps skipped, scale {}\n", scaler->skippedSteps(),
               scaler->steps(), scaler->currentScale());
  }
  train::FullState state = trainer.gatherFullState();
  if (lead) {
    if (!f.save.empty()) {
      train::writeFullState(f.save, state);
      fmt::print("saved the full model to {} (load it in one process with --generate-from)\n",
                 f.save);
    }
    auto one = train::makeGpt(c, train::tensor::TensorGroup{});
    train::loadFullState(*one, state);
    if (f.generate > 0) fmt::print("--- sample ---\n{}\n--- end ---\n", generate(one, c, f));
    std::cout << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shoal: a GPT-style byte-level language model on fortunes, on a DP x PP x TP grid"};
  Flags f;
  examples::NumericFlags numbers;
  numbers.integer(app, "--tensor-parallel", f.tensor, 1, 4096, "ranks splitting each layer");
  numbers.integer(app, "--pipeline-stages", f.pipeline, 1, 4096, "pipeline stages");
  numbers.integer(app, "--data-parallel", f.data, 0, 1 << 20,
                  "replicas (0: world / (pipeline x tensor))");
  app.add_option("--order", f.order, "grid dimensions, fastest-varying (adjacent ranks) first")
      ->capture_default_str();
  numbers.integer(app, "--micro-batches", f.microBatches, 1, 1 << 16, "pipeline micro-batches");
  app.add_option("--schedule", f.schedule, "gpipe, 1f1b or interleaved")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  numbers.integer(app, "--steps", f.steps, 1, int64_t{1} << 40,
                  "training steps (their windows are held in memory)");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "global batch (sequences)");
  numbers.integer(app, "--sequence", f.sequence, 2, 1 << 16, "context length (bytes)");
  numbers.integer(app, "--hidden", f.hidden, 1, 1 << 16, "model width");
  numbers.integer(app, "--heads", f.heads, 1, 4096, "attention heads");
  numbers.integer(app, "--layers", f.layers, 1, 4096, "transformer blocks");
  numbers.number(app, "--lr", f.lr, 1e-12, 10, "AdamW learning rate (weight decay 0.01)");
  numbers.integer(app, "--seed", f.seed, 0, int64_t{1} << 40, "model and data seed");
  numbers.integer(app, "--eval-every", f.evalEvery, 1, int64_t{1} << 40,
                  "steps between validations");
  numbers.integer(app, "--eval-batches", f.evalBatches, 1, 1 << 20, "validation batches");
  numbers.integer(app, "--generate", f.generate, 0, 1 << 20, "bytes to generate at the end");
  numbers.number(app, "--temperature", f.temperature, 0, 100, "sampling temperature");
  app.add_option("--prompt", f.prompt, "text to continue")->capture_default_str();
  app.add_option("--corpus", f.corpus, "fortune files")->capture_default_str();
  app.add_option("--save", f.save, "write the trained full model (a sealed file) on rank 0");
  app.add_option("--generate-from", f.generateFrom,
                 "no training: load a saved model into one process and generate");
  app.add_option("--precision", f.precision,
                 "fp32, bf16 (CPU autocast) or fp16 (emulated, with loss scaling)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--checkpoint-dir", f.checkpointDir,
                 "every rank's shard every --checkpoint-every steps (exact resume, same split)");
  numbers.integer(app, "--checkpoint-every", f.checkpointEvery, 1, int64_t{1} << 40,
                  "steps between checkpoints");
  app.add_flag("--resume", f.resume, "continue from the newest checkpoint every shard has");
  return examples::runExample("gpt_fortunes", app, numbers, argc, argv, [&] {
    return f.generateFrom.empty() ? trainMain(f) : generateOnly(f);
  });
}
