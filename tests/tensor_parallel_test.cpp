// Tensor parallelism with real processes under `shoal run` (rank programs in
// tests/tensor_worker.cpp): every parallel layer equals its one-process computation for 2, 3 and
// 4 ranks; a block costs Megatron's two all-reduces forward and two backward; the GPT trained
// on DP x PP x TP grids equals one-process training; a split model exports to one process; a
// model the grid cannot split is the same one-line error on every rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {
namespace {

ShellRun job(int n, const std::string& args) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run -n {} --timeout 60 -- {} {}",
      SHOAL_BIN, n, TENSOR_WORKER_BIN, args));
}

size_t count(const std::string& text, const std::string& what) {
  size_t c = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++c;
  return c;
}

void expectLayers(int n) {
  auto r = job(n, "layers");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
  // 51 checks per rank (tests/tensor_worker.cpp's layers()).
  EXPECT_EQ(count(r.output, "] OK "), static_cast<size_t>(51 * n)) << r.output;
  EXPECT_EQ(count(r.output, "DONE failures 0"), static_cast<size_t>(n)) << r.output;
}

TEST(TensorParallel, LayersOverTwoRanksEqualOneProcess) {
  expectLayers(2);
}
TEST(TensorParallel, LayersOverThreeRanksEqualOneProcess) {
  expectLayers(3);
}
TEST(TensorParallel, LayersOverFourRanksEqualOneProcess) {
  expectLayers(4);
}

TEST(TensorParallel, BlockCostsMegatronsTwoAllreducesEachWay) {
  for (int n : {2, 4}) {
    auto r = job(n, "count");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(count(r.output, "COUNT forward 2 backward 2 allgathers 0 (forward pass: 2 0)"),
              static_cast<size_t>(n))
        << r.output;
  }
}

void expectGpt(int data, int pipeline, int tensor, const std::string& schedule = "1f1b") {
  const int n = data * pipeline * tensor;
  auto r = job(n, fmt::format("gpt {} {} {} {}", data, pipeline, tensor, schedule));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
  EXPECT_EQ(count(r.output, "parameters equal"), static_cast<size_t>(n)) << r.output;
  EXPECT_EQ(count(r.output, "] OK gpt"), static_cast<size_t>(4 * n)) << r.output;  // + 3 losses
}

TEST(TensorParallel, GptTensorTwoEqualsOneProcess) {
  expectGpt(1, 1, 2);
}
TEST(TensorParallel, GptPipelineTwoTensorTwoEqualsOneProcess) {
  expectGpt(1, 2, 2);
}
TEST(TensorParallel, GptDataTwoTensorTwoEqualsOneProcess) {
  expectGpt(2, 1, 2);
}
TEST(TensorParallel, GptDataTwoPipelineTwoTensorTwoOnEightRanksEqualsOneProcess) {
  expectGpt(2, 2, 2);
}
TEST(TensorParallel, GptInterleavedPipelineWithTensorTwoEqualsOneProcess) {
  expectGpt(1, 2, 2, "interleaved");
}

// Dropout on a split activation draws a different mask on every tensor rank (with one shared
// stream, torch::nn::Dropout would draw the same one on each slice).
TEST(TensorParallel, ShardedDropoutDrawsIndependentMasksPerRank) {
  auto r = job(3, "dropout");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
  // Per rank: the drop rate, the scale, the replay, 3 stream checks, 2 mask checks, eval.
  EXPECT_EQ(count(r.output, "] OK dropout"), 3u * 9u) << r.output;
}

TEST(TensorParallel, TensorTwoModelExportsToOneProcess) {
  TempDir dir;
  auto r = job(2, fmt::format("export 2 {}/model.pt", dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "] OK export tensor 2: one-process logits"), 2u) << r.output;
}

void expectResume(int data, int pipeline, int tensor) {
  TempDir dir;
  auto r = job(data * pipeline * tensor,
               fmt::format("resume {} {} {} {}", data, pipeline, tensor, dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "parameters bitwise equal"),
            static_cast<size_t>(data * pipeline * tensor))
      << r.output;
}

TEST(TensorParallel, ShardedCheckpointResumesExactlyWithTensorTwo) {
  expectResume(2, 1, 2);
}
TEST(TensorParallel, ShardedCheckpointResumesExactlyWithPipelineTwoTensorTwo) {
  expectResume(1, 2, 2);
}

// bf16 and fp16 (loss scaling) reach fp32's loss; an overflow on one tensor-parallel rank is
// skipped by every rank of the grid.
void expectPrecision(int data, int pipeline, int tensor) {
  const int n = data * pipeline * tensor;
  auto r = job(n, fmt::format("precision {} {} {}", data, pipeline, tensor));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "] OK bf16"), static_cast<size_t>(n)) << r.output;
  EXPECT_EQ(count(r.output, "] OK fp16"), static_cast<size_t>(n)) << r.output;
}

TEST(TensorParallel, MixedPrecisionWithTensorTwo) {
  expectPrecision(1, 1, 2);
}
TEST(TensorParallel, MixedPrecisionWithPipelineTwoTensorTwo) {
  expectPrecision(1, 2, 2);
}

TEST(TensorParallel, HeadsThatDoNotDivideAreOneErrorOnEveryRank) {
  // 4 heads over tensor 3.
  auto r = job(3, "gpt 1 1 3");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_EQ(
      count(r.output,
            "] ERROR InvalidArgument: tensor parallelism: 4 attention heads do not divide over "
            "tensor 3"),
      3u)
      << r.output;
}

// "step N: loss L, validation loss V" from the example's output.
std::vector<std::pair<double, double>> losses(const std::string& output) {
  std::vector<std::pair<double, double>> out;
  std::regex re(R"(step \d+: loss ([0-9.]+), validation loss ([0-9.]+))");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  }
  return out;
}

// The README's promise: any grid shape with the same global batch follows one process's loss
// curve (AdamW, 8 steps; printed to 4 decimals, compared within 1e-3 relative).
TEST(TensorParallel, ExampleOnEightRanksFollowsOneProcessLossCurve) {
  const std::string args = "--steps 8 --eval-every 2 --batch 16 --generate 0";
  auto one =
      runShell(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 300 {} {}", GPT_EXAMPLE_BIN, args));
  ASSERT_EQ(one.code, 0) << one.output;
  auto grid = runShell(
      fmt::format("OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 8 -- {} --tensor-parallel 2 "
                  "--pipeline-stages 2 --data-parallel 2 {}",
                  SHOAL_BIN, GPT_EXAMPLE_BIN, args));
  ASSERT_EQ(grid.code, 0) << grid.output;
  auto a = losses(one.output), b = losses(grid.output);
  ASSERT_EQ(a.size(), 4u) << one.output;
  ASSERT_EQ(b.size(), 4u) << grid.output;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].first, b[i].first, 1e-3 * a[i].first) << "loss, report " << i;
    EXPECT_NEAR(a[i].second, b[i].second, 1e-3 * a[i].second) << "validation, report " << i;
  }
  EXPECT_LT(a.back().first, a.front().first) << one.output;  // it learns
}

}  // namespace
}  // namespace shoal::test
