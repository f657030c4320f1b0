// The Trainer in an elastic job (train/trainer.h, "Elastic jobs"), with real workers under
// `shoal run --elastic` (tests/elastic_trainer_worker.cpp): a death that the survivors go on
// from, checked bit for bit against a job resumed from the state they continued from; the
// exact mean over a step's samples however they are spread (against one process with the same
// global batch); a restarted worker joining a compressed job; a job below its minimum writing
// its state, and a smaller job resuming from it; the strategies that are not elastic refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {
namespace {

struct Done {
  int member, rank, world;
  long long step;
  int changes;
  std::string digest;
  double sum, dot, lr;
};

std::vector<Done> doneLines(const std::string& out) {
  static const std::regex re(
      R"(DONE member (\d+) rank (\d+) world (\d+) step (\d+) changes (\d+) digest ([0-9a-f]+) )"
      R"(sum ([0-9.e+-]+) dot ([0-9.e+-]+) lr ([0-9.e+-]+))");
  std::vector<Done> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    v.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoll(m[4]),
                 std::stoi(m[5]), m[6], std::stod(m[7]), std::stod(m[8]), std::stod(m[9])});
  }
  return v;
}

struct ViewLine {
  int member, oldSize, newSize;
  long long resumed;
};

std::vector<ViewLine> viewLines(const std::string& out) {
  static const std::regex re(
      R"(VIEW member (\d+) generation \d+ old (\d+) new (\d+) rank \d+ resumed (\d+))");
  std::vector<ViewLine> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    v.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoll(m[4])});
  }
  return v;
}

// The samples of each epoch line, in order.
std::vector<long long> epochSamples(const std::string& out) {
  static const std::regex re(R"(EPOCH epoch \d+ samples (\d+))");
  std::vector<long long> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    v.push_back(std::stoll((*it)[1]));
  }
  return v;
}

// `launcher`: shoal run's options before --; `env`: variables for the whole job.
ShellRun job(const std::string& launcher, const std::string& args, const std::string& env = "") {
  return runShell(fmt::format(
      "{} OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run --timeout 30 {} -- {} {}",
      env, SHOAL_BIN, launcher, ELASTIC_TRAINER_WORKER_BIN, args));
}

std::vector<long long> stateSteps(const std::string& dir) {
  static const std::regex re(R"(elastic-(\d+)\.state)");
  std::vector<long long> steps;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) steps.push_back(std::stoll(m[1]));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Member 3 dies in onStep of step 7 of 4 workers. The survivors go on at 3 and agree, every
// sample of the last epoch is trained once (602 samples: the epochs' last steps give some
// ranks fewer samples, or none), and they end bit for bit where 3 workers resumed from the
// state they continued from (the job's own checkpoint of that step) end: the same state, data
// order and rate schedule, nothing lost or repeated. `strategy`: ddp (one-file checkpoints), or
// zero1/zero2 (the shards kept by zero::ElasticZero; sharded checkpoints). `samples` 602 give
// the epochs' last steps to fewer ranks than there are; `model`: the worker's model flags.
void survivorsEqualAJobResumedFromTheirStep(const std::string& strategy, int samples,
                                            const std::string& model = "") {
  SCOPED_TRACE(strategy);
  TempDir dir;
  const std::string first = dir.path + "/first";
  const std::string common = fmt::format(
      "--strategy {} --samples {} --batch 8 --epochs 3 --optimizer adam --lr 0.01 --warmup 4 "
      "--cosine --validate-every 5 --checkpoint-every 1 --keep 1000 {}",
      strategy, samples, model);
  auto r =
      job("--elastic 2:4 -n 4", fmt::format("{} --die 3:7 --checkpoint-dir {}", common, first));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 3u) << r.output;
  for (const auto& d : done) {
    EXPECT_NE(d.member, 3);
    EXPECT_EQ(d.world, 3);
    EXPECT_EQ(d.changes, 1);
    EXPECT_EQ(d.step, done[0].step);
    EXPECT_EQ(d.digest, done[0].digest) << "replicas differ";
  }
  const auto views = viewLines(r.output);
  ASSERT_EQ(views.size(), 3u) << r.output;
  const long long resumed = views[0].resumed;
  for (const auto& v : views) {
    EXPECT_EQ(v.oldSize, 4);
    EXPECT_EQ(v.newSize, 3);
    EXPECT_EQ(v.resumed, resumed);
  }
  // The schedule follows the samples: 3 workers take more steps than the 57 of 4 the cosine
  // decay was planned for, and the last one is still above zero (a schedule by steps would
  // have reached zero 18 steps before the end).
  EXPECT_GT(done[0].step, 3 * ((samples + 31) / 32));
  EXPECT_GT(done[0].lr, 0);
  EXPECT_LT(done[0].lr, 1e-4);
  // It died after its all-reduce: the survivors committed step 7 (or, at most, one before).
  EXPECT_TRUE(resumed == 7 || resumed == 6) << resumed;
  const auto epochs = epochSamples(r.output);
  ASSERT_EQ(epochs.size(), 3u) << r.output;
  // The first epoch's sums are the survivors': all of it but the 8 samples a step member 3
  // took until the step they continued from.
  EXPECT_EQ(epochs[0], samples - resumed * 8);
  EXPECT_EQ(epochs[1], samples);
  EXPECT_EQ(epochs[2], samples);

  const std::string second = dir.path + "/second";
  const std::string name = strategy == "ddp" ? fmt::format("/elastic-{}.state", resumed)
                                             : fmt::format("/elastic-shards/step-{:08d}", resumed);
  ASSERT_TRUE(std::filesystem::exists(first + name)) << "no checkpoint of step " << resumed;
  std::filesystem::create_directories(std::filesystem::path(second + name).parent_path());
  std::filesystem::copy(first + name, second + name, std::filesystem::copy_options::recursive);
  // With the first job's schedule: steps of 4 workers.
  auto ref =
      job("--elastic 3:3 -n 3",
          fmt::format("{} --checkpoint-dir {} --resume --schedule-workers 4", common, second));
  ASSERT_EQ(ref.code, 0) << ref.output;
  const auto expected = doneLines(ref.output);
  ASSERT_EQ(expected.size(), 3u) << ref.output;
  EXPECT_NE(ref.output.find(fmt::format("START member 0 step {} ", resumed)), std::string::npos)
      << ref.output;
  EXPECT_EQ(expected[0].step, done[0].step);
  EXPECT_EQ(expected[0].digest, done[0].digest) << "the elastic run differs from the resumed one";
}

TEST(ElasticTrainer, DdpSurvivorsOfADeathEqualAJobResumedFromTheStepTheyContinuedFrom) {
  survivorsEqualAJobResumedFromTheirStep("ddp", 602);
}

TEST(ElasticTrainer, Zero2SurvivorsOfADeathEqualAJobResumedFromTheStepTheyContinuedFrom) {
  // With BatchNorm: its buffers go through the view change with the shards (an int64 buffer
  // failed the first change of a FashionCnn job). 600 samples: no micro-batch of 1 sample,
  // which BatchNorm1d refuses in training.
  survivorsEqualAJobResumedFromTheirStep("zero2", 600, "--batchnorm");
}

// 4 workers with 8 samples per micro-batch and 2 micro-batches per step take 64 samples a step,
// as one process with batches of 64 does; their update must be the mean over the step's
// samples, equal to the one process's up to rounding. 578 samples leave 2 for each epoch's
// last step: two of the four ranks get none and send zeros, the other two one sample each.
TEST(ElasticTrainer, FourWorkersTrainWhatOneProcessDoesWithTheirGlobalBatch) {
  const std::string common =
      "--samples 578 --epochs 2 --optimizer sgd --lr 0.1 --warmup 3 --cosine";
  auto four = job("--elastic 4:4 -n 4", common + " --batch 8 --accumulate 2");
  ASSERT_EQ(four.code, 0) << four.output;
  auto one = job("--elastic 1:1 -n 1", common + " --batch 64");
  ASSERT_EQ(one.code, 0) << one.output;
  const auto a = doneLines(four.output);
  const auto b = doneLines(one.output);
  ASSERT_EQ(a.size(), 4u) << four.output;
  ASSERT_EQ(b.size(), 1u) << one.output;
  EXPECT_EQ(a[0].step, 20);  // ceil(578 / 64) x 2
  EXPECT_EQ(b[0].step, 20);
  for (const auto& d : a) EXPECT_EQ(d.digest, a[0].digest) << "replicas differ";
  EXPECT_NEAR(a[0].sum, b[0].sum, 1e-5 * (1 + std::abs(b[0].sum))) << four.output << one.output;
  EXPECT_NEAR(a[0].dot, b[0].dot, 1e-5 * (1 + std::abs(b[0].dot))) << four.output << one.output;
  EXPECT_EQ(epochSamples(four.output), (std::vector<long long>{578, 578}));
}

// Member 2 dies in step 8 and the launcher starts it again: it joins a job compressed by
// PowerSGD after its warm-up, gets the running state (model, optimizer or its shard, and the
// hook's: with a new hook's warm-up its plain all-reduce would meet the others' PowerSGD and
// fail the job), and trains 5 steps with the others, who all end with the same parameters. A
// checkpoint is due at every step, so the joiner writes its part of them with the others.
void killedWorkerRejoinsACompressedJob(const std::string& strategy) {
  SCOPED_TRACE(strategy);
  TempDir dir;
  auto r = job("--elastic 2:4 -n 4 --max-restarts 1",
               fmt::format("--samples 600 --batch 8 --die 2:8 --until-world 4 --min-view-steps 5 "
                           "--compression powersgd:1,warmup=3 --strategy {} --checkpoint-dir {} "
                           "--checkpoint-every 1",
                           strategy, dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 4u) << r.output;
  bool joined = false;
  for (const auto& d : done) {
    EXPECT_EQ(d.world, 4);
    EXPECT_EQ(d.step, done[0].step);
    EXPECT_EQ(d.digest, done[0].digest) << "the joiner did not get the running state";
    joined |= d.member == 4;
  }
  EXPECT_TRUE(joined) << r.output;
  EXPECT_NE(r.output.find("restarting it as member 4"), std::string::npos) << r.output;
}

TEST(ElasticTrainer, AKilledWorkerRejoinsACompressedDdpJobWithItsRunningState) {
  killedWorkerRejoinsACompressedJob("ddp");
}

TEST(ElasticTrainer, AKilledWorkerRejoinsACompressedZero1JobWithItsRunningState) {
  killedWorkerRejoinsACompressedJob("zero1");
}

// 3 workers with a minimum of 3: when one dies, the other two wait below the minimum, give up,
// and write the state of the step they committed (elastic-stopped.state, beside the periodic
// checkpoints). A job of 2 resumes from it, not from the older periodic one, and keeps the
// newest 2 periodic states.
TEST(ElasticTrainer, AJobBelowItsMinimumWritesItsStateAndASmallerJobResumesFromIt) {
  TempDir dir;
  const std::string common = fmt::format(
      "--samples 400 --batch 8 --epochs 2 --checkpoint-dir {} --checkpoint-every 2 --keep 2",
      dir.path);
  auto r = job("--elastic 3:4 -n 3", common + " --die 2:5", "SHOAL_ELASTIC_WAIT=2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("elastic-stopped.state"), std::string::npos) << r.output;
  ASSERT_TRUE(std::filesystem::exists(dir.path + "/elastic-stopped.state"));
  EXPECT_EQ(stateSteps(dir.path), (std::vector<long long>{2, 4}));

  auto resumed = job("--elastic 2:2 -n 2", common + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("START member 0 step 5 epoch 0"), std::string::npos)
      << resumed.output;
  const auto done = doneLines(resumed.output);
  ASSERT_EQ(done.size(), 2u) << resumed.output;
  const auto steps = stateSteps(dir.path);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps.back(), done[0].step);
}

// linearScaling multiplies the rate by the current view's size: 4 x 0.01 until member 3 dies,
// 3 x 0.01 after (each survivor's last step says).
TEST(ElasticTrainer, LinearScalingFollowsTheViewsSize) {
  auto r =
      job("--elastic 2:4 -n 4", "--samples 400 --batch 8 --lr 0.01 --linear-scaling --die 3:5");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 3u) << r.output;
  for (const auto& d : done) EXPECT_DOUBLE_EQ(d.lr, 0.03) << r.output;
}

// stepsPerEpoch caps an epoch at that many steps of the launch's size: 3 x 8 x 4 = 96 samples.
TEST(ElasticTrainer, StepsPerEpochCapsAnEpochsSamples) {
  auto r = job("--elastic 4:4 -n 4", "--samples 600 --batch 8 --epochs 2 --steps-per-epoch 3");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 4u) << r.output;
  EXPECT_EQ(done[0].step, 6);
  EXPECT_EQ(epochSamples(r.output), (std::vector<long long>{96, 96}));
}

TEST(ElasticTrainer, StrategiesThatAreNotElasticAreRefused) {
  auto r = job("--elastic 2:2 -n 2", "--strategy zero3");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("zero3 is not elastic"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace shoal::test
