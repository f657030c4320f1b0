// Pipeline parallelism with real processes under `shoal run` (rank programs in
// tests/pipeline_worker.cpp): results equal one-process training for every schedule, stage
// count and micro-batch count, with and without activation checkpointing, and with data x
// pipeline; the measured bubble matches the formulas; a killed stage fails every other stage
// naming it; a resumed run ends bitwise equal to an uninterrupted one; a checkpoint of another
// split is refused.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <regex>
#include <string>

#include "tests/process_util.h"
#include "train/residual_mlp.h"

namespace shoal::test {
namespace {

ShellRun job(int n, const std::string& args, int timeoutSeconds = 30) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run -n {} --timeout {} -- {} {}",
      SHOAL_BIN, n, timeoutSeconds, PIPELINE_WORKER_BIN, args));
}

size_t count(const std::string& text, const std::string& what) {
  size_t c = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++c;
  return c;
}

void expectEquivalence(int n, int stages) {
  auto r = job(n, fmt::format("--mode equivalence --stages {}", stages));
  ASSERT_EQ(r.code, 0) << r.output;
  // 3 schedules x 3 micro-batch counts x (with, without checkpointing), on every rank.
  EXPECT_EQ(count(r.output, "] OK "), static_cast<size_t>(3 * 3 * 2 * n)) << r.output;
  EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
}

TEST(Pipeline, TwoStagesEqualOneProcess) {
  expectEquivalence(2, 2);
}
TEST(Pipeline, ThreeStagesEqualOneProcess) {
  expectEquivalence(3, 3);
}
TEST(Pipeline, FourStagesEqualOneProcess) {
  expectEquivalence(4, 4);
}
TEST(Pipeline, TwoReplicasOfTwoStagesEqualOneProcess) {
  expectEquivalence(4, 2);
}

// "BUBBLE rank r measured x formula y peak_in_flight k peak_bytes b" from every rank.
struct Bubble {
  double measured, formula;
  int peak;
};
std::vector<Bubble> bubbles(const std::string& output) {
  std::vector<Bubble> out;
  std::regex re(R"(BUBBLE rank \d+ measured ([0-9.]+) formula ([0-9.]+) peak_in_flight (\d+))");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stoi((*it)[3])});
  }
  return out;
}

void expectBubble(const std::string& schedule, int stages, int m, int chunks, int peakAtMost) {
  auto r = job(stages, fmt::format("--mode bubble --stages {} --schedule {} --micro-batches {} "
                                   "--chunks {} --steps 4 --fwd-ms 30 --bwd-ms 60",
                                   stages, schedule, m, chunks));
  ASSERT_EQ(r.code, 0) << r.output;
  auto b = bubbles(r.output);
  ASSERT_EQ(b.size(), static_cast<size_t>(stages)) << r.output;
  for (const auto& x : b) {
    EXPECT_NEAR(x.measured, x.formula, 0.03) << r.output;
    EXPECT_LE(x.peak, peakAtMost) << r.output;
  }
}

TEST(PipelineBubble, GpipeMatchesFormulaAndHoldsEveryMicroBatch) {
  expectBubble("gpipe", 4, 8, 1, 8);
}
TEST(PipelineBubble, OneForwardOneBackwardMatchesFormulaAndHoldsAtMostStages) {
  expectBubble("1f1b", 4, 8, 1, 4);
}
TEST(PipelineBubble, InterleavedMatchesFormula) {
  expectBubble("interleaved", 4, 8, 2, 16);
}

TEST(PipelineFailure, AKilledStageFailsEveryOtherStageNamingIt) {
  TempDir dir;
  auto r = job(3, "--mode train --stages 3 --steps 6 --crash-at-step 3 --crash-rank 1", 20);
  EXPECT_NE(r.code, 0) << r.output;
  // Both survivors fail, each naming pipeline rank 1 as the cause, and their own action.
  for (int survivor : {0, 2}) {
    std::regex re(
        fmt::format(R"(\[{}\] ERROR PeerError: pipeline stage {} .*of step 3.*cause: rank 1)",
                    survivor, survivor));
    EXPECT_TRUE(std::regex_search(r.output, re)) << "rank " << survivor << "\n" << r.output;
  }
}

TEST(PipelineFailure, AStageThatSendsTheWrongShapeFailsBothSidesNamingIt) {
  auto r = job(2, "--mode bad-shape", 20);
  EXPECT_NE(r.code, 0) << r.output;
  // The sender names its stage, action, micro-batch and both shapes...
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[0\] ERROR MismatchError: pipeline stage 0 \(pipeline rank 0\), )"
                           R"(SendActivation\(mb 0, chunk 0\) of step 1: .*\[11, 16\] Float, but )"
                           R"(the plan has \[-1, 8\] Float)")))
      << r.output;
  // ... and the receiver fails with that as the cause.
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[1\] ERROR PeerError: pipeline stage 1 .*RecvActivation\(mb 0, )"
                           R"(chunk 0\) of step 1: .*cause: rank 0.*\[11, 16\] Float)")))
      << r.output;
}

// Trains 6 steps with a checkpoint every 2 into `dir`; kills `crashRank` before step 5 when
// asked, and resumes when asked. Each rank saves its parameters into <dir>/final-<rank>.pt.
ShellRun trainJob(int n, int stages, const std::string& dir, const std::string& extra) {
  return job(n, fmt::format("--mode train --stages {} --steps 6 --checkpoint-dir {} {}", stages,
                            dir, extra));
}

void expectResumeEqualsUninterrupted(int n, int stages, const std::string& a,
                                     const std::string& b) {
  auto full = trainJob(n, stages, a, fmt::format("--save-params {}/final-%r.pt", a));
  ASSERT_EQ(full.code, 0) << full.output;
  auto crashed = trainJob(n, stages, b, fmt::format("--crash-at-step 5 --crash-rank {}", n - 1));
  EXPECT_NE(crashed.code, 0) << crashed.output;
  auto resumed = trainJob(n, stages, b, fmt::format("--resume --save-params {}/final-%r.pt", b));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed at step 4"), std::string::npos) << resumed.output;
  for (int rank = 0; rank < n; ++rank) {
    std::vector<torch::Tensor> x, y;
    torch::load(x, fmt::format("{}/final-{}.pt", a, rank));
    torch::load(y, fmt::format("{}/final-{}.pt", b, rank));
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i], y[i])) << rank << " " << i;
  }
}

TEST(PipelineCheckpoint, ResumedAfterAKillEndsBitwiseEqual) {
  TempDir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b";
  expectResumeEqualsUninterrupted(2, 2, a, b);
  // The same checkpoints under another split are refused, naming both.
  auto other = job(2, fmt::format("--mode train --stages 2 --steps 6 --checkpoint-dir {} "
                                  "--resume --schedule interleaved --chunks 2",
                                  b));
  EXPECT_NE(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("written by another split"), std::string::npos) << other.output;
}

// A lost stage under shoal run --max-restarts: every rank is started again and resumes from the
// last sharded checkpoint at the same size, ending bitwise equal to an uninterrupted run.
TEST(PipelineRestart, ALostStageRestartsTheJobFromTheLastCheckpoint) {
  TempDir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b";
  auto full = trainJob(3, 3, a, fmt::format("--save-params {}/final-%r.pt", a));
  ASSERT_EQ(full.code, 0) << full.output;
  auto r = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run -n 3 --timeout 20 "
      "--max-restarts 1 -- {} --mode "
      "train --stages 3 --steps 6 --checkpoint-dir {} --crash-at-step 5 --crash-rank 1 --resume "
      "--save-params {}/final-%r.pt",
      SHOAL_BIN, PIPELINE_WORKER_BIN, b, b));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed at step 4"), std::string::npos) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<torch::Tensor> x, y;
    torch::load(x, fmt::format("{}/final-{}.pt", a, rank));
    torch::load(y, fmt::format("{}/final-{}.pt", b, rank));
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i], y[i])) << rank << " " << i;
  }
}

// DP x PP: each stage's shard is written by its first replica and read back into both.
TEST(PipelineCheckpoint, TwoReplicasResumeBitwiseEqual) {
  TempDir dir;
  expectResumeEqualsUninterrupted(4, 2, dir.path + "/a", dir.path + "/b");
}

}  // namespace
}  // namespace shoal::test
