// train::Trainer as users run it: examples/trainer_mnist under `shoal run` with each strategy
// chosen by a flag (DDP, ZeRO 1-3, parameter servers, pipeline, tensor, hybrid), gradient
// accumulation, clipping, bf16 and fp16, AdamW, capped epochs, validation every N steps, resume
// from its checkpoints, and its configuration errors; examples/gpt_fortunes (a loss that takes
// the grid, the grid's order, the gathered full model, the loss scaler) and
// examples/pipeline_mnist (the pipeline's last-step timeline) on the Trainer. The same seed and
// data give DDP and ZeRO the same losses (they compute the same averaged gradients), and each grid
// strategy the losses of a simpler equivalent job, which ties the strategies to one another besides
// each one learning.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {
namespace {

struct Epoch {
  int epoch;
  double trainLoss;
  double accuracy;  // percent
  int step;
  std::string validationLoss;  // as printed
  int64_t jobSamples;          // trained by the whole job in the epoch (every replica's)
};

// Rank 0's "epoch N: step S, train loss L, validation loss V, accuracy A%, T s, J samples
// trained by the job" lines.
std::vector<Epoch> epochs(const std::string& output) {
  static const std::regex line(
      R"(epoch (\d+): step (\d+), train loss ([0-9.]+), validation loss ([0-9.]+), accuracy ([0-9.]+)%, [0-9.]+ s, (\d+) samples trained by the job)");
  std::vector<Epoch> e;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    e.push_back({std::stoi((*it)[1]), std::stod((*it)[3]), std::stod((*it)[5]), std::stoi((*it)[2]),
                 (*it)[4], std::stoll((*it)[6])});
  }
  return e;
}

ShellRun train(const std::string& launch, const std::string& flags) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run {} --timeout 60 -- {} --train-subset 1200 "
      "--test-subset 600 {}--threads 1 {} 2>&1",
      SHOAL_BIN, launch, TRAINER_MNIST_BIN,
      flags.find("--batch ") == std::string::npos ? "--batch 30 " : "", flags));
}

// Two epochs learn: the second epoch's loss is lower, the accuracy well above chance (10%).
void expectLearns(const ShellRun& r) {
  ASSERT_EQ(r.code, 0) << r.output;
  const auto e = epochs(r.output);
  ASSERT_EQ(e.size(), 2u) << r.output;
  EXPECT_LT(e[1].trainLoss, e[0].trainLoss) << r.output;
  EXPECT_GT(e[1].accuracy, 50.0) << r.output;
}

// One epoch on 2 ranks with `flags`, then resumed for two with `resumeLaunch`: only epoch 2
// runs, and it learns.
void expectResumesAtTheNextEpoch(const std::string& flags, const std::string& resumeLaunch) {
  const auto first = train("-n 2", flags + " --epochs 1");
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_EQ(epochs(first.output).size(), 1u) << first.output;
  const auto second = train(resumeLaunch, flags + " --epochs 2 --resume");
  ASSERT_EQ(second.code, 0) << second.output;
  const auto e = epochs(second.output);
  ASSERT_EQ(e.size(), 1u) << second.output;
  EXPECT_EQ(e[0].epoch, 2);
  EXPECT_GT(e[0].accuracy, 50.0) << second.output;
}

TEST(Trainer, DdpAndZeroStagesLearnTheSameFromTheSameSeed) {
  std::vector<std::vector<Epoch>> runs;
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    const auto r = train("-n 2", fmt::format("--strategy {} --epochs 2", strategy));
    expectLearns(r);
    runs.push_back(epochs(r.output));
  }
  for (size_t s = 0; s < runs.size(); ++s) {
    // The 1,200 samples of the subset, each epoch: the two workers' shares, counted once.
    for (const Epoch& e : runs[s]) EXPECT_EQ(e.jobSamples, 1200) << "strategy " << s;
  }
  for (size_t s = 1; s < runs.size(); ++s) {
    for (size_t e = 0; e < 2 && e < runs[s].size(); ++e) {
      EXPECT_NEAR(runs[s][e].trainLoss, runs[0][e].trainLoss, 2e-3 * runs[0][e].trainLoss)
          << "strategy " << s << " epoch " << e;
    }
  }
}

TEST(Trainer, AccumulationClippingAndBf16) {
  // Traced: the job's one timeline holds the loop's spans from both ranks.
  TempDir dir;
  const std::string trace = dir.path + "/job.json";
  expectLearns(train("-n 2 --trace " + trace,
                     "--strategy ddp --epochs 2 --accumulate 2 --clip 1 --lr 2e-3 "
                     "--checkpoint-dir " +
                         dir.path + "/ckpt"));
  const std::string json = readFile(trace);
  for (const char* span : {"\"forward\"", "\"backward (accumulate)\"", "\"backward\"",
                           "\"optimizer step\"", "\"validate\"", "\"data\"", "\"ddp bucket\"",
                           "\"waited_for_launch_us\"", "\"checkpoint write\""}) {
    EXPECT_NE(json.find(span), std::string::npos) << span;
  }
  EXPECT_NE(json.find("\"pid\":1"), std::string::npos);  // rank 1's spans are there too
  expectLearns(train("-n 2", "--strategy zero2 --epochs 2 --precision bf16 --clip 5"));
}

// Gradient compression as a Trainer option: the all-reduce's hook under ddp and zero1. fp16 keeps
// plain DDP's losses up to its rounding; rank-1 PowerSGD changes them (so the hook is really
// in the path) and still learns.
TEST(Trainer, CompressedAllreduceUnderDdpAndZero1) {
  const auto plain = train("-n 2", "--strategy ddp --epochs 2");
  const auto fp16 = train("-n 2", "--strategy ddp --epochs 2 --compression fp16");
  const auto powersgd = train("-n 2", "--strategy zero1 --epochs 2 --compression powersgd:1");
  expectLearns(plain);
  expectLearns(fp16);
  expectLearns(powersgd);
  const auto a = epochs(plain.output), b = epochs(fp16.output), c = epochs(powersgd.output);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(b[e].trainLoss, a[e].trainLoss, 2e-2 * a[e].trainLoss) << "epoch " << e;
  }
  EXPECT_GT(std::abs(c[0].trainLoss - a[0].trainLoss), 1e-3 * a[0].trainLoss)
      << plain.output << powersgd.output;
}

// The codec's momentum (DGC's momentum correction) in place of the optimizer's, under ddp and
// zero1: both learn with plain SGD after the hook.
TEST(Trainer, CompressionWithMomentumLearnsWithPlainSgd) {
  for (const char* strategy : {"ddp", "zero1"}) {
    expectLearns(train("-n 2", fmt::format("--strategy {} --epochs 2 --optimizer sgd --lr 0.05 "
                                           "--momentum 0 --compression topk:0.1,momentum=0.9",
                                           strategy)));
  }
}

// A job resumed from its checkpoint trains the epoch a job that never stopped trains, to every
// printed digit, under DDP and ZeRO stage 1. Gradient compression keeps state from step to step
// on every rank (error-feedback residuals, momentum correction's velocities, PowerSGD's Q, the
// warm-up's count) and DDP its rebuilt bucket order: the checkpoints save both
// (train/hook_checkpoint.h, train/ddp_checkpoint.h). Without the state every codec's resumed
// epoch differed.
TEST(Trainer, DataParallelJobsResumeExactly) {
  const std::vector<std::string> runs = {
      "--strategy ddp",
      "--strategy ddp --compression topk:0.1",
      "--strategy ddp --compression powersgd:1",
      "--strategy ddp --compression onebit",
      "--strategy ddp --optimizer sgd --lr 0.05 --momentum 0 --compression topk:0.1,momentum=0.9",
      "--strategy zero1 --compression topk:0.1,warmup=30"};
  for (const auto& flags : runs) {
    SCOPED_TRACE(flags);
    TempDir dir;
    const auto whole = train("-n 2", flags + " --epochs 2 --checkpoint-dir " + dir.path + "/a");
    const auto first = train("-n 2", flags + " --epochs 1 --checkpoint-dir " + dir.path + "/b");
    const auto resumed =
        train("-n 2", flags + " --epochs 2 --resume --checkpoint-dir " + dir.path + "/b");
    ASSERT_EQ(whole.code, 0) << whole.output;
    ASSERT_EQ(first.code, 0) << first.output;
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    const auto a = epochs(whole.output), b = epochs(resumed.output);
    ASSERT_EQ(a.size(), 2u) << whole.output;
    ASSERT_EQ(b.size(), 1u) << resumed.output;
    EXPECT_EQ(b[0].epoch, 2);
    EXPECT_EQ(b[0].trainLoss, a[1].trainLoss) << whole.output << resumed.output;
    EXPECT_EQ(b[0].validationLoss, a[1].validationLoss);
    EXPECT_EQ(b[0].accuracy, a[1].accuracy);
    EXPECT_EQ(resumed.output.find("warn"), std::string::npos) << resumed.output;
  }
}

// A compressed job's checkpoint resumed at another world size (each rank starts from the mean
// of the saved residuals) learns; resumed with another codec, or none, it says that the saved
// state is not used, and trains.
TEST(Trainer, CompressionStateResumesAtAnotherWorldSizeOrSaysWhyNot) {
  TempDir dir;
  const std::string flags = "--strategy ddp --compression topk:0.1 --checkpoint-dir " + dir.path;
  expectResumesAtTheNextEpoch(flags + "/a", "-n 3");
  ASSERT_EQ(train("-n 2", flags + "/b --epochs 1").code, 0);
  const auto other = train("-n 2",
                           "--strategy ddp --compression powersgd:1 --epochs 2 --resume "
                           "--checkpoint-dir " +
                               dir.path + "/b");
  ASSERT_EQ(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("holds topk compression state, which this job's powersgd:1 "
                              "compression does not use: not loaded"),
            std::string::npos)
      << other.output;
  const auto none =
      train("-n 2", "--strategy ddp --epochs 3 --resume --checkpoint-dir " + dir.path + "/b");
  ASSERT_EQ(none.code, 0) << none.output;
  EXPECT_NE(none.output.find("which this job's average all-reduce does not use"), std::string::npos)
      << none.output;
}

TEST(Trainer, ParameterServerModes) {
  expectLearns(train("-n 2 --servers 1", "--strategy ps --ps-mode sync --epochs 2"));
  expectLearns(train("-n 2 --servers 1", "--strategy ps --ps-mode async --epochs 2 --lr 5e-4"));
}

TEST(Trainer, ResumesFromItsCheckpointAtTheNextEpoch) {
  TempDir dir;
  const std::string flags = "--strategy zero1 --checkpoint-dir " + dir.path + "/ckpt";
  // Resumed at another world size (the checkpoints are sharded and reshard).
  expectResumesAtTheNextEpoch(flags, "-n 3");
}

// Rank 0's train losses, one per epoch.
std::vector<double> losses(const ShellRun& r) {
  std::vector<double> l;
  for (const auto& e : epochs(r.output)) l.push_back(e.trainLoss);
  return l;
}

// The same losses within `relative` (the splits sum in other orders, so bits differ).
void expectSameLosses(const ShellRun& a, const ShellRun& b, double relative, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(b.code, 0) << b.output;
  const auto x = losses(a), y = losses(b);
  ASSERT_EQ(x.size(), 2u) << a.output;
  ASSERT_EQ(y.size(), 2u) << b.output;
  for (size_t e = 0; e < x.size(); ++e) EXPECT_NEAR(x[e], y[e], relative * y[e]) << "epoch " << e;
  // They trained on the same samples, however many ranks each replica spans: the subset's
  // 1,200 per epoch (a progress bar's rate counts these).
  for (const auto* r : {&a, &b}) {
    for (const Epoch& e : epochs(r->output)) EXPECT_EQ(e.jobSamples, 1200) << r->output;
  }
}

// Without dropout (whose masks depend on how the batch is cut), each grid strategy computes what a
// simpler job computes. BatchNorm sees the pipeline's micro-batches, so pipelines are compared
// with pipelines cutting the same micro-batches.
TEST(Trainer, GridStrategiesMatchTheirSimplerEquivalents) {
  const std::string common = "--epochs 2 --dropout 0 ";
  // Tensor parallelism splits the classifier's two layers: one process computes the same.
  const auto tensor = train("-n 2", common + "--strategy tensor --tensor 2");
  expectLearns(tensor);
  expectSameLosses(tensor, train("-n 1", common + "--strategy ddp"), 1e-2, "tensor");
  // Tensor parallelism inside each of two stages, against the two stages alone.
  expectSameLosses(train("-n 4", common + "--strategy hybrid --stages 2 --tensor 2"),
                   train("-n 2", common + "--strategy pipeline --stages 2"), 1e-2, "hybrid");
  // Two replicas of batch 30 in 3 micro-batches each, against one pipeline cutting their
  // global batch of 60 into the same 6 micro-batches of 10.
  expectSameLosses(
      train("-n 4", common + "--strategy pipeline --stages 2 --micro-batches 3"),
      train("-n 2", common + "--strategy pipeline --stages 2 --micro-batches 6 --batch 60"), 1e-2,
      "replicas");
  // The schedule orders the same work differently.
  expectSameLosses(train("-n 2", common + "--strategy pipeline --stages 2 --schedule gpipe"),
                   train("-n 2", common + "--strategy pipeline --stages 2 --schedule 1f1b"), 1e-6,
                   "schedules");
}

TEST(Trainer, GridStrategiesClipMixedPrecisionAndResume) {
  // Clipping by the whole model's norm over slices and stages; fp16 with loss scaling; bf16.
  expectLearns(train("-n 4", "--strategy hybrid --stages 2 --tensor 2 --epochs 2 --clip 1"));
  expectLearns(train("-n 2", "--strategy tensor --tensor 2 --epochs 2 --precision fp16"));
  // Traced: the pipeline's actions are on the timeline; at the end, the split advice.
  TempDir traced;
  const auto bf16 = train("-n 2 --trace " + traced.path + "/job.json",
                          "--strategy pipeline --stages 2 --epochs 2 --precision bf16");
  expectLearns(bf16);
  EXPECT_NE(bf16.output.find("pipeline stages measured"), std::string::npos) << bf16.output;
  // Interleaved: advised over its virtual stages, judged by each rank's chunks.
  const auto interleaved =
      train("-n 2", "--strategy pipeline --stages 2 --chunks 2 --schedule interleaved --epochs 2");
  expectLearns(interleaved);
  EXPECT_NE(interleaved.output.find("pipeline virtual stages measured"), std::string::npos)
      << interleaved.output;
  EXPECT_NE(interleaved.output.find("2 chunks per rank: ranks"), std::string::npos)
      << interleaved.output;
  const std::string json = readFile(traced.path + "/job.json");
  for (const char* span :
       {"\"Forward(mb 0, chunk 0)\"", "\"Backward(mb 3, chunk 0)\"", "\"forward and backward\""}) {
    EXPECT_NE(json.find(span), std::string::npos) << span;
  }
  // A pipeline's stage shards, resumed at the next epoch.
  TempDir dir;
  const std::string flags = "--strategy pipeline --stages 2 --checkpoint-dir " + dir.path + "/c";
  expectResumesAtTheNextEpoch(flags, "-n 2");
  // Another split is refused, naming both.
  const auto other = train("-n 2",
                           "--strategy tensor --tensor 2 --epochs 2 --resume "
                           "--checkpoint-dir " +
                               dir.path + "/c");
  EXPECT_NE(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("layout"), std::string::npos) << other.output;
}

// The whole model gathered from each strategy that keeps one per replica (DDP, ZeRO-1 and 2)
// and from a pipeline's stages, saved, and run by one process: it scores what the job's last
// validation scored. The model has BatchNorm, so the saved state must carry its running
// statistics (buffers): with the initial ones it would load and score far lower.
TEST(Trainer, AGatheredModelRunsAloneAsTheJobValidatedIt) {
  TempDir dir;
  const struct {
    const char* launch;
    const char* flags;
  } cases[] = {{"-n 2", "--strategy ddp"},
               {"-n 2", "--strategy zero1"},
               {"-n 2", "--strategy zero2"},
               {"-n 2", "--strategy pipeline --stages 2"}};
  static const std::regex alone(R"(accuracy ([0-9.]+)% on 600 samples)");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags);
    const std::string file = dir.path + "/model.pt";
    const auto job = train(c.launch, fmt::format("{} --epochs 2 --save {}", c.flags, file));
    expectLearns(job);
    const auto e = epochs(job.output);
    ASSERT_EQ(e.size(), 2u);
    const auto run = runShell(fmt::format(
        "OPENBLAS_NUM_THREADS=1 timeout 120 {} --evaluate-from {} --test-subset 600 --threads 1 "
        "2>&1",
        TRAINER_MNIST_BIN, file));
    ASSERT_EQ(run.code, 0) << run.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.output, m, alone)) << run.output;
    // The replicas' running statistics differ by their own last batches (validation uses each
    // rank's on its share; the file holds rank 0's): close, not equal.
    EXPECT_NEAR(std::stod(m[1]), e[1].accuracy, 2.0) << run.output << job.output;
  }
  // A state that does not fit the model is refused before anything runs, naming the file.
  std::ofstream(dir.path + "/junk.pt") << "not a model";
  const auto junk =
      runShell(fmt::format("{} --evaluate-from {}/junk.pt 2>&1", TRAINER_MNIST_BIN, dir.path));
  EXPECT_NE(junk.code, 0) << junk.output;
  EXPECT_NE(junk.output.find("junk.pt"), std::string::npos) << junk.output;
}

// A finished pipeline job resumed has nothing left to train: it ends cleanly (no split advice
// from steps it did not measure), on the split its checkpoints were written with.
TEST(Trainer, AFinishedPipelineJobResumesToNothing) {
  TempDir dir;
  const std::string flags =
      "--strategy pipeline --stages 2 --epochs 1 --steps 2 --checkpoint-dir " + dir.path + "/c";
  const auto first = train("-n 2", flags);
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_EQ(epochs(first.output).size(), 1u) << first.output;
  const auto again = train("-n 2", flags + " --resume");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_TRUE(epochs(again.output).empty()) << again.output;
  // The split is the checkpoints', not one measured anew (a loaded machine measures another).
  EXPECT_NE(again.output.find("resume: the split the checkpoints"), std::string::npos)
      << again.output;
}

TEST(Trainer, BadConfigurationIsOneLineAndExitCodeTwo) {
  const struct {
    const char* launch;
    const char* flags;
    const char* message;
  } cases[] = {
      {"-n 1", "--strategy pipe", "unknown strategy 'pipe' (choose ddp, zero1"},
      {"-n 1", "--strategy pipeline", "strategy pipeline needs pipelineStages >= 2"},
      {"-n 2", "--strategy ddp --stages 2", "strategy ddp does not split the model"},
      {"-n 3", "--strategy pipeline --stages 2", "do not divide the world's 3"},
      {"-n 2", "--strategy pipeline --stages 2 --accumulate 2", "accumulate must be 1"},
      {"-n 2", "--strategy pipeline --stages 2 --micro-batches 64",
       "64 pipeline micro-batches do not fit in a batch of 30"},
      {"-n 2", "--strategy tensor --tensor 2 --precision fp16 --clip 1",
       "fp16 with clipping is not supported"},
      {"-n 1", "--strategy ps", "strategy ps needs parameter servers"},
      {"-n 1", "--precision fp16", "precision fp16 needs loss scaling"},
      {"-n 1", "--resume", "resume needs checkpointDir"},
      {"-n 2 --servers 1", "--strategy ps --optimizer adamw",
       "parameter server does not support adamw"},
      {"-n 2", "--strategy zero2 --compression fp16",
       "compression fp16 is the all-reduce's (strategies ddp and zero1); strategy zero2"},
      {"-n 2", "--compression topk:2", "topk"},
      {"-n 2", "--optimizer sgd --compression topk:0.1,momentum=0.9",
       "Trainer: compression topk:0.1,momentum=0.9 applies the momentum itself; the optimizer "
       "must be sgd with momentum 0, not sgd with momentum 0.9"},
      {"-n 2", "--strategy zero1 --compression onebit,momentum=0.5",
       "the optimizer must be sgd with momentum 0, not adam"},
      {"-n 2", "--optimizer sgd --momentum 0 --clip 1 --compression topk:0.1,momentum=0.9",
       "sends momentum updates, not gradients; clipNorm 1 would clip those"},
      {"-n 2 --servers 1",
       "--strategy ps --optimizer sgd --momentum 0 --compression topk:0.1,momentum=0.9",
       "parameter servers do not support compression topk:0.1,momentum=0.9: momentum= and "
       "dense= are DDP's and ZeRO-1's"},
  };
  for (const auto& c : cases) {
    const auto r = train(c.launch, c.flags);
    EXPECT_NE(r.code, 0) << c.flags;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
  }
}

TEST(Trainer, StepsPerEpochCapsEachEpoch) {
  // 600 samples per rank make 20 steps of 30; capped at 3, the epochs end at steps 3 and 6.
  const auto ddp = train("-n 2", "--strategy ddp --epochs 2 --steps 3");
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  auto e = epochs(ddp.output);
  ASSERT_EQ(e.size(), 2u) << ddp.output;
  EXPECT_EQ(e[0].step, 3);
  EXPECT_EQ(e[1].step, 6);
  // The grid strategies count global batches: the same cap.
  const auto pipe = train("-n 2", "--strategy pipeline --stages 2 --epochs 2 --steps 2");
  ASSERT_EQ(pipe.code, 0) << pipe.output;
  e = epochs(pipe.output);
  ASSERT_EQ(e.size(), 2u) << pipe.output;
  EXPECT_EQ(e[0].step, 2);
  EXPECT_EQ(e[1].step, 4);
}

struct Validation {
  int step;
  double trainLoss;
  std::string validationLoss;  // as printed
  double perplexity;
};

// Rank 0's "validation at step S: train loss L, validation loss V, perplexity P, ..." lines.
std::vector<Validation> validations(const std::string& output) {
  static const std::regex line(
      R"(validation at step (\d+): train loss ([0-9.]+), validation loss ([0-9.]+), perplexity ([0-9.]+))");
  std::vector<Validation> v;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    v.push_back({std::stoi((*it)[1]), std::stod((*it)[2]), (*it)[3], std::stod((*it)[4])});
  }
  return v;
}

TEST(Trainer, ValidatesEveryNStepsAndAtEachEpochsEnd) {
  // 20 steps per epoch, validated every 8: 8, 16, the epoch's end (20), 24, 32, and 40 once,
  // which is both a multiple of 8 and the end.
  const auto r = train("-n 2", "--strategy ddp --epochs 2 --validate-every 8");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto v = validations(r.output);
  std::vector<int> steps;
  for (const auto& x : v) steps.push_back(x.step);
  EXPECT_EQ(steps, (std::vector<int>{8, 16, 20, 24, 32, 40})) << r.output;
  for (const auto& x : v) {
    EXPECT_NEAR(x.perplexity, std::exp(std::stod(x.validationLoss)), 1e-3 * x.perplexity);
    EXPECT_GT(x.trainLoss, 0);
  }
  // Each epoch reports the validation at its end, not another one.
  const auto e = epochs(r.output);
  ASSERT_EQ(e.size(), 2u) << r.output;
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(e[0].validationLoss, v[2].validationLoss);
  EXPECT_EQ(e[1].validationLoss, v[5].validationLoss);
  EXPECT_LT(std::stod(v[5].validationLoss), std::stod(v[0].validationLoss)) << r.output;
}

TEST(Trainer, AdamWLearnsTheSameUnderDdpAndZeroAndIsNotAdam) {
  const std::string flags = "--epochs 2 --optimizer adamw --weight-decay 0.1 --strategy ";
  const auto ddp = train("-n 2", flags + "ddp");
  expectLearns(ddp);
  expectSameLosses(ddp, train("-n 2", flags + "zero1"), 2e-3, "zero1");
  // Decoupled decay is not L2 regularisation: Adam with the same weight decay trains otherwise.
  const auto adam = train("-n 2", "--epochs 2 --optimizer adam --weight-decay 0.1 --strategy ddp");
  ASSERT_EQ(adam.code, 0) << adam.output;
  EXPECT_NE(losses(adam), losses(ddp)) << adam.output;
}

// examples/gpt_fortunes, short: 6 steps of 8 sequences, validated every 3.
ShellRun gpt(const std::string& launch, const std::string& flags) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run {} --timeout 60 -- {} --steps 6 --eval-every 3 "
      "--batch 8 --micro-batches 2 --generate 30 {} 2>&1",
      SHOAL_BIN, launch, GPT_FORTUNES_BIN, flags));
}

struct GptReport {
  int step;
  double loss;
  double validationLoss;
  double perplexity;
};

// Rank 0's "step S: loss L, validation loss V, perplexity P, T tokens/s" lines.
std::vector<GptReport> gptReports(const std::string& output) {
  static const std::regex line(
      R"(step (\d+): loss ([0-9.]+), validation loss ([0-9.]+), perplexity ([0-9.]+), [0-9]+ tokens/s)");
  std::vector<GptReport> v;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    v.push_back(
        {std::stoi((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  }
  return v;
}

// The text between rank 0's sample markers (the generated bytes, prompt included), without
// shoal run's "[0] " line prefixes.
std::string sample(const std::string& output) {
  std::string rank0, line;
  std::istringstream in(output);
  while (std::getline(in, line)) {
    if (line.rfind("[0] ", 0) == 0) rank0 += line.substr(4) + "\n";
  }
  const std::string begin = "--- sample ---\n", end = "\n--- end ---";
  const size_t a = rank0.find(begin);
  if (a == std::string::npos) return {};
  const size_t b = rank0.find(end, a + begin.size());
  return b == std::string::npos ? std::string()
                                : rank0.substr(a + begin.size(), b - a - begin.size());
}

// A loss that takes the grid (vocabulary-parallel cross-entropy over its tensor group), the
// grid's order, validation every N steps, the gathered full model.
TEST(Trainer, GptOnAGridFollowsOneProcessAndItsGatheredModelRunsAlone) {
  TempDir dir;
  const auto one = gpt("-n 1", "");
  const auto grid = gpt("-n 4",
                        "--tensor-parallel 2 --pipeline-stages 2 --order "
                        "pipeline,tensor,data --save " +
                            dir.path + "/grid.pt");
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(grid.code, 0) << grid.output;
  EXPECT_NE(grid.output.find("grid data 1 x pipeline 2 x tensor 2 (order pipeline,tensor,data)"),
            std::string::npos)
      << grid.output;
  const auto a = gptReports(one.output), b = gptReports(grid.output);
  ASSERT_EQ(a.size(), 2u) << one.output;
  ASSERT_EQ(b.size(), 2u) << grid.output;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, static_cast<int>(3 * (i + 1)));
    EXPECT_EQ(b[i].step, a[i].step);
    EXPECT_NEAR(b[i].loss, a[i].loss, 1e-3 * a[i].loss) << "step " << a[i].step;
    EXPECT_NEAR(b[i].validationLoss, a[i].validationLoss, 1e-3 * a[i].validationLoss);
    EXPECT_NEAR(a[i].perplexity, std::exp(a[i].validationLoss), 1e-2 * a[i].perplexity);
  }
  EXPECT_LT(a[1].validationLoss, a[0].validationLoss) << one.output;
  // The gathered model, saved and loaded by one process, writes what the grid's did.
  const std::string text = sample(grid.output);
  ASSERT_GT(text.size(), 4u) << grid.output;
  EXPECT_EQ(text.rfind("The ", 0), 0u) << text;
  const auto alone = runShell(
      fmt::format("OPENBLAS_NUM_THREADS=1 {} --generate-from {}/grid.pt --generate 30 2>&1",
                  GPT_FORTUNES_BIN, dir.path));
  ASSERT_EQ(alone.code, 0) << alone.output;
  EXPECT_EQ(alone.output, text + "\n");
}

TEST(Trainer, GptUnderFp16ReportsItsLossScaler) {
  const auto r = gpt("-n 2", "--tensor-parallel 2 --precision fp16");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(gptReports(r.output).size(), 2u) << r.output;
  static const std::regex scaler(R"(loss scaling: (\d+) of 6 steps skipped, scale [0-9.e+]+)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, scaler)) << r.output;
  EXPECT_LT(std::stoi(m[1]), 6) << r.output;
}

TEST(Trainer, PipelineMnistWritesItsLastStepsTimeline) {
  TempDir dir;
  const std::string trace = dir.path + "/last.json";
  const auto r = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 2 --timeout 60 -- {} --pipeline-stages 2 "
      "--micro-batches 4 --steps 3 --train-subset 2000 --trace {} 2>&1",
      SHOAL_BIN, PIPELINE_MNIST_BIN, trace));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("trace of the last step: " + trace), std::string::npos) << r.output;
  const std::string json = readFile(trace);
  // Both stages' rows, and the last micro-batch's actions on them.
  for (const char* s : {"rank 0, stage 0", "rank 1, stage 1", "mb 3"}) {
    EXPECT_NE(json.find(s), std::string::npos) << s << "\n" << json.substr(0, 2000);
  }
}

}  // namespace
}  // namespace shoal::test
