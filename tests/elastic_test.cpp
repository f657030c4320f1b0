// Elastic training with real processes under `shoal run --elastic` (tests/elastic_worker.cpp):
// a worker SIGKILLed at a chosen step, the survivors going on, checked bit for bit against two
// plain jobs chained through a checkpoint; a restarted worker rejoining; the job giving up below
// its minimum with the state written, and resuming from it; a host discovery program growing
// and shrinking the job.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {
namespace {

struct Done {
  int member, rank, world;
  long long step, resumed;
  int changes;
  double recovery;
  std::string digest;
};

std::vector<Done> doneLines(const std::string& out) {
  static const std::regex re(
      R"(DONE member (\d+) rank (\d+) world (\d+) step (\d+) resumed (-?\d+) changes (\d+) )"
      R"(recovery ([0-9.]+) digest ([0-9a-f]+))");
  std::vector<Done> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    v.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoll(m[4]),
                 std::stoll(m[5]), std::stoi(m[6]), std::stod(m[7]), m[8]});
  }
  return v;
}

// The lr each worker ended with ("LR member M world W lr X" lines), in the order printed.
std::vector<double> lrLines(const std::string& out) {
  static const std::regex re(R"(LR member \d+ world \d+ lr ([0-9.e+-]+))");
  std::vector<double> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    v.push_back(std::stod((*it)[1]));
  }
  return v;
}

// The scales the workers printed ("SCALE member M scale X steps K"), as "X K" strings.
std::vector<std::string> scaleLines(const std::string& out) {
  static const std::regex re(R"(SCALE member \d+ scale ([0-9.e+]+) steps (\d+))");
  std::vector<std::string> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    v.push_back(fmt::format("{} {}", (*it)[1].str(), (*it)[2].str()));
  }
  return v;
}

// `launcher` are shoal run's options before --.
ShellRun job(const std::string& launcher, const std::string& args) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run --timeout 30 {} -- {} {}",
      SHOAL_BIN, launcher, ELASTIC_WORKER_BIN, args));
}

// One worker SIGKILLs itself in step `step`; the 3 survivors finish 40 steps. Their parameters
// must equal 4 ranks trained to the step they continued from, saved, and 3 ranks trained on
// from that file to step 40: the same state, the same data order, nothing lost or repeated.
// `engine`: the worker's flags for how it trains ("": DDP; "--zero 2": ZeRO stage 2, whose
// reference goes through a sharded checkpoint).
// `where`: the worker's --die point (before, middle, after).
void shrinkEqualsReference(int member, int step, const std::string& where,
                           const std::string& engine = "") {
  SCOPED_TRACE(fmt::format("member {} dies in step {} ({}, {})", member, step, where,
                           engine.empty() ? "DDP" : engine));
  const std::string common = "--samples 600 --batch 8 " + engine;
  auto r = job("--elastic 2:4 -n 4",
               fmt::format("{} --steps 40 --die {}:{}:{}", common, member, step, where));
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 3u) << r.output;
  for (const auto& d : done) {
    EXPECT_NE(d.member, member);
    EXPECT_EQ(d.world, 3);
    EXPECT_EQ(d.step, 40);
    EXPECT_EQ(d.changes, 1);
    EXPECT_EQ(d.digest, done[0].digest) << "replicas differ";
    EXPECT_EQ(d.resumed, done[0].resumed);
    // The failure came in step `step`: the survivors continue from the step before it, or
    // from it when the dead worker's all-reduce had completed somewhere.
    EXPECT_TRUE(d.resumed == step - 1 || (where == "after" && d.resumed == step)) << d.resumed;
    EXPECT_LT(d.recovery, 30.0);  // a generous bound: 1 s or less on an idle machine
  }
  EXPECT_NE(r.output.find("the other workers go on without it"), std::string::npos) << r.output;

  TempDir dir;
  const std::string file = dir.path + "/state.pt";
  auto a =
      job("-n 4", fmt::format("{} --plain --steps {} --save {}", common, done[0].resumed, file));
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = job("-n 3", fmt::format("{} --plain --steps 40 --load {}", common, file));
  ASSERT_EQ(b.code, 0) << b.output;
  auto ref = doneLines(b.output);
  ASSERT_EQ(ref.size(), 3u) << b.output;
  EXPECT_EQ(ref[0].digest, done[0].digest) << "the elastic run differs from the reference";
}

TEST(ElasticShrink, LastRankDiesBeforeItsAllreduce) {
  shrinkEqualsReference(3, 6, "before");
}

TEST(ElasticShrink, RankZeroDiesAfterItsAllreduce) {
  shrinkEqualsReference(0, 11, "after");
}

TEST(ElasticShrink, RandomRankAndStep) {
  std::random_device seed;
  std::mt19937 gen(seed());
  const int member = static_cast<int>(gen() % 4);
  const int step = 2 + static_cast<int>(gen() % 35);
  const bool after = gen() % 2;
  shrinkEqualsReference(member, step, after ? "after" : "before");
}

// fp16 with dynamic loss scaling (ElasticOptions::lossScaler): member 2 dies after its backward,
// so the survivors fail in the loss scaler's all-reduce, with their gradients already unscaled.
// They must still equal the plain jobs, which carry the scaler through their file.
TEST(ElasticShrink, Fp16RankDiesBeforeTheLossScalersAgreementEqualsReference) {
  shrinkEqualsReference(2, 9, "middle", "--fp16");
}

// Member 2 dies in step 8 and is restarted by the launcher: it joins as member 4, gets the
// running state, trains at least 5 steps with the others, and the job ends at 4 workers that
// agree. `args`: the worker's other flags; the job's run goes to *run (the caller's further
// checks).
void killedWorkerRejoins(const std::string& args, ShellRun* run = nullptr) {
  auto r = job("--elastic 2:4 -n 4 --max-restarts 1",
               "--steps 30 --samples 600 --batch 8 --until-world 4 --min-view-steps 5 "
               "--die 2:8:before " +
                   args);
  if (run) *run = r;
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 4u) << r.output;
  bool joined = false;
  for (const auto& d : done) {
    EXPECT_EQ(d.world, 4);
    EXPECT_EQ(d.digest, done[0].digest) << "the joiner did not get the running state";
    EXPECT_EQ(d.step, done[0].step);
    EXPECT_GE(d.step, 30);
    joined |= d.member == 4;
  }
  EXPECT_TRUE(joined) << r.output;
  EXPECT_NE(r.output.find("restarting it as member 4"), std::string::npos) << r.output;
}

TEST(ElasticRestart, KilledWorkerRejoinsAndTheJobEndsAtFour) {
  killedWorkerRejoins("");
}

// A worker joining an fp16 job gets the running loss scale (the scale doubles every 3 steps, so
// by then it is far from the start): DDP averages scaled gradients, and a joiner scaling by
// another factor would move its parameters away from the others'.
TEST(ElasticRestart, AWorkerJoiningAnFp16JobGetsTheLossScale) {
  ShellRun r;
  killedWorkerRejoins("--fp16", &r);
  if (HasFatalFailure()) return;
  const auto lines = scaleLines(r.output);
  EXPECT_EQ(lines.size(), 4u) << r.output;
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), 1u)
      << "the workers' loss scales differ\n"
      << r.output;
}

// ZeRO (train/zero/zero_elastic.h): the dead rank's shard comes from the copy its next rank
// kept; after the all-gather, the survivors may have to go back one step for it.
TEST(ElasticZero, Stage2LastRankDiesBeforeItsReduceScatter) {
  shrinkEqualsReference(3, 6, "before", "--zero 2");
}

TEST(ElasticZero, Stage1RankZeroDiesAfterItsAllGather) {
  shrinkEqualsReference(0, 11, "after", "--zero 1");
}

TEST(ElasticZero, Stage2RandomRankAndStep) {
  std::random_device seed;
  std::mt19937 gen(seed());
  const int member = static_cast<int>(gen() % 4);
  const int step = 2 + static_cast<int>(gen() % 35);
  const bool after = gen() % 2;
  shrinkEqualsReference(member, step, after ? "after" : "before", "--zero 2");
}

// The compression hook's lines of a --compression job: "HOOK" after each commit, "HOOKIN" as a
// view after the first starts (tests/elastic_worker.cpp).
struct HookLine {
  std::string what;
  int member;
  long long step;
  std::string own, shared;
  long long steps;
};

std::vector<HookLine> hookLines(const std::string& out) {
  static const std::regex re(
      R"((HOOK|HOOKIN) member (\d+) step (\d+) own ([0-9a-f]+) shared ([0-9a-f]+) steps (\d+))");
  std::vector<HookLine> v;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    v.push_back({m[1], std::stoi(m[2]), std::stoll(m[3]), m[4], m[5], std::stoll(m[6])});
  }
  return v;
}

// Top-k compression (error feedback), with DDP or ZeRO-1 (`engine`): the failed step had
// already changed every survivor's residuals when its communication failed. Each survivor that
// committed the step the job continues from must start the new view with its own compression
// state of that step (train/elastic_hook_state.h); one that had not (DDP: it missed the step
// the others completed) with the same shared state and step count as the others.
void survivorsRestoreTheirOwnCompressionState(int member, int step, bool after,
                                              const std::string& engine) {
  SCOPED_TRACE(fmt::format("member {} dies in step {} {} its communication ({})", member, step,
                           after ? "after" : "before", engine.empty() ? "DDP" : engine));
  auto r = job("--elastic 2:4 -n 4",
               fmt::format("{} --compression topk:0.1 --steps 20 --samples 600 --batch 8 "
                           "--die {}:{}:{}",
                           engine, member, step, after ? "after" : "before"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 3u) << r.output;
  const auto lines = hookLines(r.output);
  int own = 0;
  for (const auto& d : done) {
    EXPECT_EQ(d.digest, done[0].digest) << "replicas differ";
    EXPECT_EQ(d.changes, 1);
    const HookLine* committed = nullptr;  // its first line of the step: before the failure
    const HookLine* entered = nullptr;
    for (const auto& l : lines) {
      if (l.member != d.member || l.step != d.resumed) continue;
      if (l.what == "HOOK" && !committed) committed = &l;
      if (l.what == "HOOKIN") entered = &l;
    }
    ASSERT_NE(entered, nullptr) << r.output;
    EXPECT_EQ(entered->steps, d.resumed);
    if (!committed) continue;
    ++own;
    EXPECT_EQ(entered->own, committed->own)
        << "member " << d.member << " did not get its own residuals of step " << d.resumed
        << " back";
    EXPECT_EQ(entered->shared, committed->shared);
  }
  EXPECT_GE(own, 1) << "no survivor had committed the step it continued from\n" << r.output;
}

TEST(ElasticShrink, CompressedSurvivorsGoOnWithTheirOwnResidualsOfTheStep) {
  survivorsRestoreTheirOwnCompressionState(3, 6, false, "");
}

TEST(ElasticShrink, CompressedSurvivorsOfADeathAfterTheAllreduceKeepTheirResiduals) {
  survivorsRestoreTheirOwnCompressionState(0, 11, true, "");
}

TEST(ElasticZero, CompressedSurvivorsGoOnWithTheirOwnResidualsOfTheStep) {
  survivorsRestoreTheirOwnCompressionState(3, 6, false, "--zero 1");
}

TEST(ElasticZero, CompressedSurvivorsOfADeathAfterTheAllGatherKeepTheirResiduals) {
  survivorsRestoreTheirOwnCompressionState(0, 11, true, "--zero 1");
}

// PowerSGD after its warm-up: a restarted worker joins with the running compression state (the
// others' step count and Q, the mean of their residuals) and trains 5 steps with them. With a
// new hook's it would still be warming up, sending its plain gradients into the others' PowerSGD
// all-reduce: the job failed with a MismatchError.
void joinerGetsTheRunningCompressionState(const std::string& engine) {
  ShellRun r;
  killedWorkerRejoins(engine + " --compression powersgd:1,warmup=3", &r);
  if (::testing::Test::HasFatalFailure()) return;
  const auto lines = hookLines(r.output);
  const HookLine* joined = nullptr;
  for (const auto& l : lines) {
    if (l.member == 4 && l.what == "HOOKIN") joined = &l;
  }
  ASSERT_NE(joined, nullptr) << r.output;
  EXPECT_GT(joined->steps, 3) << "joined during the warm-up: the test proves nothing";
  int others = 0;
  for (const auto& l : lines) {
    if (l.member == 4 || l.what != "HOOKIN" || l.step != joined->step) continue;
    ++others;
    EXPECT_EQ(joined->shared, l.shared) << "the joiner's Q is not member " << l.member << "'s";
    EXPECT_EQ(joined->steps, l.steps);
  }
  EXPECT_GE(others, 3) << r.output;
}

TEST(ElasticRestart, AWorkerJoiningACompressedJobGetsItsRunningState) {
  joinerGetsTheRunningCompressionState("");
}

TEST(ElasticZero, AWorkerJoiningACompressedJobGetsItsRunningState) {
  joinerGetsTheRunningCompressionState("--zero 1");
}

// Ranks 1 and 3 of 4 keep each other's neighbours' copies: both can die at once.
TEST(ElasticZero, TwoRanksThatAreNotNeighboursDieTogether) {
  auto r = job("--elastic 2:4 -n 4",
               "--zero 2 --steps 30 --samples 600 --batch 8 --die 1:6:before --die 3:6:before");
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 2u) << r.output;
  for (const auto& d : done) {
    EXPECT_EQ(d.world, 2);
    EXPECT_EQ(d.step, 30);
    EXPECT_EQ(d.resumed, 5);
    EXPECT_EQ(d.digest, done[0].digest) << "replicas differ";
  }
}

// Neighbours 1 and 2 take shard 1 and its only copy with them: every survivor says so.
TEST(ElasticZero, NeighboursDyingTogetherLoseAShardAndTheJobFailsSayingSo) {
  auto r = job("--elastic 2:4 -n 4",
               "--zero 2 --steps 30 --samples 600 --batch 8 --die 1:6:before --die 2:6:before");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] ERROR InvalidArgument: elastic ZeRO: the survivors do not hold "
                          "every shard"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[3] ERROR InvalidArgument: elastic ZeRO"), std::string::npos)
      << r.output;
}

TEST(ElasticZero, KilledWorkerRejoinsAndGetsAShard) {
  killedWorkerRejoins("--zero 2");
}

TEST(ElasticZero, AOneFileCheckpointIsRefused) {
  auto r = job("--elastic 1:1 -n 1", "--zero 2 --steps 3 --checkpoint /nonexistent/state");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("sharded over the ranks and has no one-file form"), std::string::npos)
      << r.output;
}

TEST(ElasticMinimum, TwoDieTheJobWaitsThenFailsWithTheStateWritten) {
  TempDir dir;
  const std::string ck = dir.path + "/elastic.state";
  auto r = job("--elastic 3:4 -n 4 -x SHOAL_ELASTIC_WAIT=2",
               fmt::format("--steps 40 --die 1:6:before --die 2:6:before --checkpoint {}", ck));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("too few workers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the minimum is 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the state of step 5 was written"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fewer than the minimum 3"), std::string::npos) << r.output;
  ASSERT_TRUE(std::filesystem::exists(ck));
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++files;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";

  // The state resumes at another size.
  auto resumed = job("--elastic 1:2 -n 2", fmt::format("--steps 9 --resume {}", ck));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  auto done = doneLines(resumed.output);
  ASSERT_EQ(done.size(), 2u) << resumed.output;
  EXPECT_EQ(done[0].step, 9);
  EXPECT_EQ(done[0].digest, done[1].digest);

  // Not a state file: one line naming it.
  const std::string bad = dir.path + "/bad.state";
  std::ofstream(bad) << "not a state";
  auto refused = job("--elastic 1:1 -n 1", fmt::format("--steps 9 --resume {}", bad));
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("not a Shoal elastic state"), std::string::npos) << refused.output;
}

// The state file an fp16 job writes below its minimum holds the loss scaler's state: resumed
// at 2 workers to step 9, the scale is a plain job's after 9 steps (it doubles every 3 good
// steps, so a scaler started anew would be behind). A job without a scaler refuses the file.
TEST(ElasticMinimum, AnFp16JobsStateFileHoldsTheLossScale) {
  TempDir dir;
  const std::string ck = dir.path + "/elastic.state";
  auto r =
      job("--elastic 3:4 -n 4 -x SHOAL_ELASTIC_WAIT=2",
          fmt::format("--fp16 --steps 40 --die 1:6:before --die 2:6:before --checkpoint {}", ck));
  EXPECT_NE(r.code, 0) << r.output;
  ASSERT_NE(r.output.find("the state of step 5 was written"), std::string::npos) << r.output;
  auto resumed = job("--elastic 1:2 -n 2", fmt::format("--fp16 --steps 9 --resume {}", ck));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  auto plain = job("-n 2", "--plain --fp16 --steps 9");
  ASSERT_EQ(plain.code, 0) << plain.output;
  const auto want = scaleLines(plain.output);
  const auto got = scaleLines(resumed.output);
  ASSERT_EQ(want.size(), 2u) << plain.output;
  ASSERT_EQ(got.size(), 2u) << resumed.output;
  EXPECT_EQ(got[0], want[0]) << resumed.output;
  EXPECT_EQ(got[1], want[0]) << resumed.output;

  auto refused = job("--elastic 1:1 -n 1", fmt::format("--steps 9 --resume {}", ck));
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("holds a loss scaler's state, and this job has none"),
            std::string::npos)
      << refused.output;
}

// A host discovery program in `dir` (run/host_discovery.h) that prints `before` until the file
// `dir`/started exists, then `after`.
std::string discoveryScript(const std::string& dir, const std::string& before,
                            const std::string& after) {
  const std::string path = dir + "/discover.sh";
  std::ofstream(path) << fmt::format(
      "#!/bin/sh\nif [ -e {0}/started ]; then echo {2}; else echo {1}; fi\n", dir, before, after);
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

// An --elastic 2:3 job whose discovery program lists `before`, then `after` once rank 0 made a
// step (at a view of `startedAt` workers, 0: any); `args` are the worker's.
ShellRun discoveryJob(const std::string& before, const std::string& after, int startedAt,
                      const std::string& args) {
  TempDir dir;
  const std::string script = discoveryScript(dir.path, before, after);
  return job(
      fmt::format("--elastic 2:3 --host-discovery-script {} --discovery-interval 0.1", script),
      fmt::format("--samples 600 --batch 8 --started-file {}/started --started-at {} {}", dir.path,
                  startedAt, args));
}

TEST(ElasticDiscovery, ANewSlotGetsAWorkerThatJoinsTheRunningJob) {
  auto r = discoveryJob("localhost:2", "localhost:3", 2,
                        "--steps 20 --until-world 3 --lr-scaling linear");
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 3u) << r.output;
  int joiners = 0;
  for (const auto& d : done) {
    EXPECT_EQ(d.world, 3);
    EXPECT_EQ(d.digest, done[0].digest) << "the joiner did not get the running state";
    joiners += d.member == 2 && d.resumed == -1;
  }
  EXPECT_EQ(joiners, 1) << r.output;
  // The launch's 2 workers are the reference: at 3 the lr is 3/2 of the one set, on every rank
  // (the joiner too).
  EXPECT_EQ(lrLines(r.output),
            (std::vector<double>{0.05 * (3.0 / 2), 0.05 * (3.0 / 2), 0.05 * (3.0 / 2)}))
      << r.output;
  EXPECT_NE(r.output.find("rank 2 (member 2) starts on localhost to join the running job"),
            std::string::npos)
      << r.output;
}

TEST(ElasticDiscovery, ASlotThatLeavesHasItsWorkerStoppedAndTheOthersGoOn) {
  auto r = discoveryJob("localhost:3", "localhost:2", 0,
                        "--steps 5 --until-shrunk-to 2 --lr-scaling sqrt");
  ASSERT_EQ(r.code, 0) << r.output;
  auto done = doneLines(r.output);
  ASSERT_EQ(done.size(), 2u) << r.output;
  for (const auto& d : done) {
    EXPECT_NE(d.member, 2);
    EXPECT_EQ(d.world, 2);
    EXPECT_EQ(d.changes, 1);
    EXPECT_EQ(d.digest, done[0].digest);
  }
  EXPECT_NE(r.output.find("rank 2 (member 2): localhost no longer offers its slot; stopping it"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("2 workers finished; 0 failed along the way"), std::string::npos)
      << r.output;
  const double lr = 0.05 * std::sqrt(2.0 / 3);
  EXPECT_EQ(lrLines(r.output), (std::vector<double>{lr, lr})) << r.output;
}

// A worker started by hand (`shoal join`, run/join_file.h) joins a running job of 2 at a step
// boundary, gets the running state from a peer and trains on to the end with it; the launcher
// does not count it, and its join file is gone after the job.
TEST(ElasticJoin, AWorkerStartedByHandJoinsTheRunningJob) {
  TempDir dir;
  const std::string file = dir.path + "/job.join";
  const std::string worker =
      fmt::format("{} --samples 600 --batch 8 --steps 20 --until-world 3", ELASTIC_WORKER_BIN);
  const Proc::Env env = {{"OPENBLAS_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}};
  Proc running({"/bin/sh", "-c",
                fmt::format("exec {} run --timeout 30 --elastic 2:3 -n 2 --join-file {} -- {} "
                            "--progress-every 1",
                            SHOAL_BIN, file, worker)},
               dir.path + "/job.out", env);
  // The job trains (and waits at each step for a third worker) once rank 0 made a step.
  ASSERT_TRUE(running.waitForOutput("STEP 1", std::chrono::seconds(120))) << running.output();
  Proc joiner({"/bin/sh", "-c", fmt::format("exec {} join {} -- {}", SHOAL_BIN, file, worker)},
              dir.path + "/joiner.out", env);
  ASSERT_EQ(joiner.wait(std::chrono::seconds(240)), 0) << joiner.output() << running.output();
  ASSERT_EQ(running.wait(std::chrono::seconds(240)), 0) << running.output();
  auto done = doneLines(running.output());
  auto joined = doneLines(joiner.output());
  ASSERT_EQ(done.size(), 2u) << running.output();
  ASSERT_EQ(joined.size(), 1u) << joiner.output();
  done.push_back(joined[0]);
  for (const auto& d : done) {
    EXPECT_EQ(d.world, 3);
    EXPECT_EQ(d.step, done[0].step);
    EXPECT_EQ(d.digest, done[0].digest) << "the joiner did not get the running state";
  }
  // Its id is the first the store gives out to workers started by hand; it joined with no state.
  EXPECT_EQ(joined[0].member, 1 << 20);
  EXPECT_EQ(joined[0].resumed, -1);
  EXPECT_NE(running.output().find("2 workers finished"), std::string::npos) << running.output();
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(ElasticLauncher, BadOptionsAreOneLineErrors) {
  struct Case {
    std::string options, message;
  } cases[] = {
      {"--elastic 3:2 -n 2", "exceeds the maximum"},
      {"--elastic 2:4 -n 5", "outside 2..4"},
      {"--elastic x -n 2", "elastic size"},
      {"--elastic 1:2 --servers 1 -n 2", "workers only"},
      {"-n 2 --host-discovery-script /bin/true", "needs --elastic"},
      {"--elastic 1:2 --host-discovery-script /no/such/program", "not found or not executable"},
      {"--elastic 1:2 --host-discovery-script /bin/false", "exited with code 1"},
      {"--elastic 1:2 --hosts localhost:2 --host-discovery-script /bin/true", "not with --hosts"},
      {"--elastic 1:2 -n 1 --discovery-interval 1", "needs --host-discovery-script"},
  };
  for (const auto& c : cases) {
    auto r = job(c.options, "--steps 1");
    EXPECT_NE(r.code, 0) << c.options;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.options << "\n" << r.output;
  }
}

}  // namespace
}  // namespace shoal::test
