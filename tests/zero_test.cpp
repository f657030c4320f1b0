// ZeRO with real processes under `shoal run` (rank programs in tests/zero_worker.cpp): stages
// 1, 2 and 3 over 2, 3 and 4 ranks train to the same parameters as Shoal's DDP and as one
// process (SGD with momentum, Adam, RMSprop; clipping by global norm; accumulation under
// noSync; a parameter count no world size divides); every category of the memory report
// matches the formula; bf16 compute with fp32 masters trains like fp32; bad options are one
// line on every rank; a rank killed mid-step fails every other rank naming it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

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
void expectEqual(int stage, int n) {
  for (const char* config : {"sgd 0 1", "adam 0.5 0", "rmsprop 0.5 1"}) {
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
