// ZeRO with real processes under `shoal run` (rank programs in tests/zero_worker.cpp): stages
// 1, 2 and 3 over 2, 3 and 4 ranks train to the same parameters as Shoal's DDP and as one
// process (SGD with momentum, Adam, RMSprop; clipping by global norm; accumulation under
// noSync; a parameter count no world size divides); every category of the memory report
// matches the formula; bf16 compute with fp32 masters trains like fp32; bad options are one
// line on every rank; a rank killed mid-step fails every other rank naming it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {
namespace {

ShellRun job(int n, const std::string& args, int timeout = 60) {
  return runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run -n {} --timeout {} -- {} {}",
      SHOAL_BIN, n, timeout, ZERO_WORKER_BIN, args));
}

size_t count(const std::string& text, const std::string& what) {
  size_t c = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++c;
  return c;
}

// Each rank prints one OK line per comparison (vs DDP, vs one process).
// Three ranks also run LAMB and LARS, whose per-layer norms are summed across the shards.
void expectEqual(int stage, int n) {
  std::vector<std::string> configs = {"sgd 0 1", "adam 0.5 0", "rmsprop 0.5 1"};
  if (n == 3) configs.insert(configs.end(), {"lamb 0 1", "lars 0.5 0"});
  for (const auto& config : configs) {
    auto r = job(n, fmt::format("equal {} {}", stage, config));
    ASSERT_EQ(r.code, 0) << config << "\n" << r.output;
    EXPECT_EQ(count(r.output, "] OK equal"), static_cast<size_t>(2 * n)) << config << r.output;
    EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
  }
}

TEST(ZeroEquals, Stage1TwoRanks) {
  expectEqual(1, 2);
}
TEST(ZeroEquals, Stage1ThreeRanks) {
  expectEqual(1, 3);
}
TEST(ZeroEquals, Stage1FourRanks) {
  expectEqual(1, 4);
}
TEST(ZeroEquals, Stage2TwoRanks) {
  expectEqual(2, 2);
}
TEST(ZeroEquals, Stage2ThreeRanks) {
  expectEqual(2, 3);
}
TEST(ZeroEquals, Stage2FourRanks) {
  expectEqual(2, 4);
}
TEST(ZeroEquals, Stage3TwoRanks) {
  expectEqual(3, 2);
}
TEST(ZeroEquals, Stage3ThreeRanks) {
  expectEqual(3, 3);
}
TEST(ZeroEquals, Stage3FourRanks) {
  expectEqual(3, 4);
}

void expectMemory(int n, const std::string& dtype) {
  for (int stage : {1, 2, 3}) {
    auto r = job(n, fmt::format("memory {} {}", stage, dtype));
    ASSERT_EQ(r.code, 0) << r.output;
    // Four categories (parameters, gradients, optimizer, total) per rank.
    EXPECT_EQ(count(r.output, "] OK memory"), static_cast<size_t>(4 * n)) << r.output;
  }
}

TEST(ZeroMemory, Fp32FourRanksMatchesTheFormulas) {
  expectMemory(4, "fp32");
}
TEST(ZeroMemory, Fp32TwoRanksMatchesTheFormulas) {
  expectMemory(2, "fp32");
}
TEST(ZeroMemory, Bf16FourRanksMatchesTheFormulas) {
  expectMemory(4, "bf16");
}

TEST(ZeroMixedPrecision, Bf16ComputeWithFp32MastersTrainsLikeFp32) {
  for (int stage : {1, 2, 3}) {
    auto r = job(2, fmt::format("mixed {}", stage));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(count(r.output, "] OK mixed"), 2u) << r.output;
  }
}

TEST(ZeroErrors, BadOptionsAndDifferentModelsAreOneLineOnEveryRank) {
  auto r = job(2, "errors");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "] OK error"), 6u) << r.output;
}

// Saves with `saver` at `from` ranks, then resumes with each (kind, ranks): equal to one
// process trained straight.
void expectReshard(const std::string& saver, int from,
                   const std::vector<std::pair<std::string, int>>& resumes) {
  TempDir dir;
  auto saved = job(from, fmt::format("reshard save {} {}", saver, dir.path));
  ASSERT_EQ(saved.code, 0) << saved.output;
  for (auto& [kind, n] : resumes) {
    auto r = job(n, fmt::format("reshard resume {} {}", kind, dir.path));
    ASSERT_EQ(r.code, 0) << kind << " at " << n << "\n" << r.output;
    EXPECT_EQ(count(r.output, "] OK resume"), static_cast<size_t>(n)) << r.output;
  }
}

TEST(ZeroReshard, Stage2SavedAtFourResumesAtTwoAndThree) {
  expectReshard("2", 4, {{"zero2", 2}, {"zero2", 3}, {"zero1", 3}, {"zero3", 2}});
}

TEST(ZeroReshard, Stage3SavedAtTwoLoadsIntoDdpAtThree) {
  expectReshard("3", 2, {{"ddp", 3}, {"zero1", 4}});
}

TEST(ZeroReshard, DdpSavedAtThreeLoadsIntoStage3AtTwo) {
  expectReshard("ddp", 3, {{"zero3", 2}, {"ddp", 4}});
}

TEST(ZeroReshard, ConsolidatedFileLoadsIntoOneProcess) {
  TempDir dir;
  auto saved = job(3, fmt::format("reshard save 1 {}", dir.path));
  ASSERT_EQ(saved.code, 0) << saved.output;
  auto tool = runShell(fmt::format("{} {} {}/model.pt", CONSOLIDATE_BIN, dir.path, dir.path));
  ASSERT_EQ(tool.code, 0) << tool.output;
  auto loaded = job(1, fmt::format("consolidated {}/model.pt", dir.path));
  ASSERT_EQ(loaded.code, 0) << loaded.output;
  EXPECT_EQ(count(loaded.output, "OK consolidated"), 1u) << loaded.output;
}

TEST(ZeroReshard, ACorruptOrMissingShardIsNamedOnEveryRank) {
  TempDir dir;
  auto saved = job(4, fmt::format("reshard save 2 {}", dir.path));
  ASSERT_EQ(saved.code, 0) << saved.output;
  const std::string step = dir.path + "/step-00000003/";
  {
    // One byte of rank 1's file flipped, near its end (the pieces' data).
    std::fstream f(step + "rank-1-of-4.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-40, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-40, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  auto corrupt = job(2, fmt::format("reshard resume zero2 {}", dir.path), 20);
  EXPECT_NE(corrupt.code, 0) << corrupt.output;
  EXPECT_EQ(count(corrupt.output, "OK resume"), 0u) << corrupt.output;
  for (int r : {0, 1}) {
    EXPECT_TRUE(std::regex_search(
        corrupt.output, std::regex(fmt::format(R"(\[{}\] ERROR .*rank-1-of-4\.shard)", r))))
        << corrupt.output;
  }
  std::filesystem::remove(step + "rank-2-of-4.shard");
  auto missing = job(3, fmt::format("reshard resume zero1 {}", dir.path), 20);
  EXPECT_NE(missing.code, 0) << missing.output;
  for (int r : {0, 1, 2}) {
    EXPECT_TRUE(std::regex_search(
        missing.output, std::regex(fmt::format(R"(\[{}\] ERROR .*rank-[12]-of-4\.shard)", r))))
        << missing.output;
  }
}

TEST(ZeroFailure, AKilledRankFailsEveryOtherRankNamingIt) {
  for (int stage : {1, 2, 3}) {
    auto r = job(3, fmt::format("crash {}", stage), 20);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_EQ(count(r.output, "finished all steps"), 0u) << r.output;
    for (int survivor : {0, 2}) {
      std::regex re(fmt::format(R"(\[{}\] ERROR PeerError: .*cause: rank 1\))", survivor));
      EXPECT_TRUE(std::regex_search(r.output, re))
          << "stage " << stage << " rank " << survivor << "\n"
          << r.output;
    }
  }
}

}  // namespace
}  // namespace shoal::test
