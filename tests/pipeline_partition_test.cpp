// The stage partitioner's pure part (no libtorch): the dynamic programme against brute force
// over every cut, its edge cases and errors, hand-given boundaries, and the plan's table.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "train/pipeline/partition.h"
#include "train/pipeline/split_advice.h"

namespace shoal::test {
namespace {

using train::pipeline::balancedCuts;
using train::pipeline::Boundaries;
using train::pipeline::byParameters;
using train::pipeline::fromBoundaries;
using train::pipeline::LayerInfo;
using train::pipeline::PartitionPlan;

// Every cut of n layers into `parts` non-empty parts in lexicographic order of the boundaries;
// returns the first that is best by the partitioner's documented order: smallest largest part,
// then smallest sum of squared parts (summed last part first), part sums as prefix differences.
Boundaries bruteForce(const std::vector<double>& cost, int parts) {
  const int n = static_cast<int>(cost.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  Boundaries b(parts + 1), best;
  double bestMax = std::numeric_limits<double>::infinity();
  double bestSquares = std::numeric_limits<double>::infinity();
  b[0] = 0;
  b[parts] = n;
  // Recursively choose b[1] < ... < b[parts - 1] in increasing (lexicographic) order.
  auto choose = [&](auto&& self, int k) -> void {
    if (k == parts) {
      double largest = 0, squares = 0;
      for (int s = parts - 1; s >= 0; --s) {
        const double part = prefix[b[s + 1]] - prefix[b[s]];
        largest = std::max(largest, part);
        squares = part * part + squares;
      }
      if (largest < bestMax || (largest == bestMax && squares < bestSquares)) {
        bestMax = largest;
        bestSquares = squares;
        best = b;
      }
      return;
    }
    for (int j = b[k - 1] + 1; j <= n - (parts - k); ++j) {
      b[k] = j;
      self(self, k + 1);
    }
  };
  choose(choose, 1);
  return best;
}

double largestPart(const std::vector<double>& cost, const Boundaries& b) {
  double largest = 0;
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    double sum = 0;
    for (int i = b[s]; i < b[s + 1]; ++i) sum += cost[i];
    largest = std::max(largest, sum);
  }
  return largest;
}

TEST(Partition, BalancedCutsEqualsBruteForceOnRandomCosts) {
  std::mt19937 rng(20240521);
  int cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 10);
    const int parts = 1 + static_cast<int>(rng() % std::min(5, n));
    std::vector<double> cost(n);
    // Three kinds of costs: continuous (unique optimum), small integers (many ties), and
    // mostly zeros (ties everywhere).
    const int kind = trial % 3;
    for (double& c : cost) {
      if (kind == 0) c = std::uniform_real_distribution<double>(0, 10)(rng);
      if (kind == 1) c = static_cast<double>(rng() % 4);
      if (kind == 2) c = rng() % 4 == 0 ? 1.0 : 0.0;
    }
    const Boundaries expected = bruteForce(cost, parts);
    const Boundaries got = balancedCuts(cost, parts);
    ASSERT_EQ(got, expected) << "n " << n << " parts " << parts << " kind " << kind;
    ASSERT_EQ(got.size(), static_cast<size_t>(parts + 1));
    for (int s = 0; s < parts; ++s) ASSERT_LT(got[s], got[s + 1]);
    ++cases;
  }
  EXPECT_EQ(cases, 3000);
}

TEST(Partition, EdgeCases) {
  const std::vector<double> cost{3, 1, 4, 1, 5};
  EXPECT_EQ(balancedCuts(cost, 5), (Boundaries{0, 1, 2, 3, 4, 5}));  // one layer each
  EXPECT_EQ(balancedCuts(cost, 1), (Boundaries{0, 5}));
  EXPECT_EQ(balancedCuts({7}, 1), (Boundaries{0, 1}));
  // All zero: every cut ties; the earliest cuts are taken, every part non-empty.
  EXPECT_EQ(balancedCuts({0, 0, 0, 0, 0, 0}, 3), (Boundaries{0, 1, 2, 6}));
  // One layer dominates: it stands alone.
  EXPECT_EQ(balancedCuts({1, 1, 100, 1, 1}, 3), (Boundaries{0, 2, 3, 5}));
  // Equal layers split evenly.
  EXPECT_EQ(balancedCuts(std::vector<double>(12, 2.5), 4), (Boundaries{0, 3, 6, 9, 12}));
  // Deterministic on repeated calls.
  EXPECT_EQ(balancedCuts(cost, 3), balancedCuts(cost, 3));
  EXPECT_EQ(largestPart(cost, balancedCuts(cost, 3)), 5.0);
}

// The error's text, or "" if none.
template <typename F>
std::string invalidArgumentOf(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void expectOneLineError(const std::string& e, const std::string& part) {
  EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(Partition, BalancedCutsErrors) {
  expectOneLineError(invalidArgumentOf([] {
                       balancedCuts({1, 2}, 0);
                     }),
                     "cannot cut 2 layers into 0 parts");
  expectOneLineError(invalidArgumentOf([] {
                       balancedCuts({1, 2}, 3);
                     }),
                     "cannot cut 2 layers into 3 parts");
  expectOneLineError(invalidArgumentOf([] { balancedCuts({}, 1); }),
                     "cannot cut 0 layers into 1 parts");
  expectOneLineError(invalidArgumentOf([] { balancedCuts({1, -2}, 1); }), "layer 1 has cost -2");
  expectOneLineError(invalidArgumentOf([] {
                       balancedCuts({std::nan(""), 1}, 1);
                     }),
                     "layer 0 has cost nan");
  expectOneLineError(invalidArgumentOf([] {
                       balancedCuts({1, std::numeric_limits<double>::infinity()}, 2);
                     }),
                     "layer 1 has cost inf");
}

TEST(Partition, ByParametersBalancesCounts) {
  // An embedding-like first layer and a large head are the bottleneck; the middle stays
  // together rather than one small layer alone (the tie is broken by the sum of squares).
  EXPECT_EQ(byParameters({1000, 10, 10, 10, 10, 900}, 3), (Boundaries{0, 1, 5, 6}));
  EXPECT_EQ(byParameters({0, 4, 4, 4, 4, 0}, 2), (Boundaries{0, 3, 6}));
  expectOneLineError(invalidArgumentOf([] {
                       byParameters({5, -1}, 1);
                     }),
                     "layer 1 has -1 parameters");
}

TEST(Partition, FromBoundaries) {
  EXPECT_EQ(fromBoundaries({0, 3, 7}, 10), (Boundaries{0, 3, 7, 10}));
  EXPECT_EQ(fromBoundaries({0}, 4), (Boundaries{0, 4}));
  EXPECT_EQ(fromBoundaries({0, 1, 2}, 3), (Boundaries{0, 1, 2, 3}));
  expectOneLineError(invalidArgumentOf([] {
                       fromBoundaries({1, 3}, 10);
                     }),
                     "stage 0 must start at layer 0, not 1");
  expectOneLineError(invalidArgumentOf([] {
                       fromBoundaries({0, 5, 5}, 10);
                     }),
                     "stage 2 starts at layer 5, not after stage 1's 5");
  expectOneLineError(invalidArgumentOf([] {
                       fromBoundaries({0, 6, 4}, 10);
                     }),
                     "stage 2 starts at layer 4, not after stage 1's 6");
  expectOneLineError(invalidArgumentOf([] {
                       fromBoundaries({0, 10}, 10);
                     }),
                     "stage 1 starts at layer 10, beyond the last layer 9");
  expectOneLineError(invalidArgumentOf([] { fromBoundaries({}, 10); }), "no stage given");
  expectOneLineError(invalidArgumentOf([] { fromBoundaries({0}, 0); }), "0 layers, need >= 1");
}

std::vector<LayerInfo> exampleLayers() {
  std::vector<LayerInfo> layers{{"flatten", 0, 0.01, 100352}, {"stem", 200960, 1.5, 65536}};
  for (int b = 0; b < 6; ++b) layers.push_back({"block" + std::to_string(b), 132096, 1.0, 65536});
  layers.push_back({"head", 2570, 0.05, 2560});
  return layers;
}

TEST(Partition, PlanByTimeDescribesItsStages) {
  const PartitionPlan plan = train::pipeline::planByTime(exampleLayers(), 2);
  EXPECT_EQ(plan.method, "time");
  ASSERT_EQ(plan.stages(), 2);
  // Cutting after block1 gives 3.51 | 4.05 ms, after block2 4.51 | 3.05: the first is better.
  EXPECT_EQ(plan.boundaries, (Boundaries{0, 4, 9}));
  EXPECT_DOUBLE_EQ(plan.stageMs(0), 0.01 + 1.5 + 2.0);
  EXPECT_DOUBLE_EQ(plan.stageMs(1), 4.05);
  EXPECT_EQ(plan.stageParameters(0), 200960 + 2 * 132096);
  EXPECT_EQ(plan.stageActivationBytes(0), 100352 + 3 * 65536);
  EXPECT_EQ(plan.stageOutputBytes(1), 2560);
  EXPECT_NEAR(plan.imbalance(), 4.05 / (7.56 / 2), 1e-12);
  const std::string table = plan.describe();
  std::printf("%s", table.c_str());
  EXPECT_NE(table.find("flatten..block1 [0, 4)"), std::string::npos) << table;
  EXPECT_NE(table.find("block2..head [4, 9)"), std::string::npos) << table;
  EXPECT_NE(table.find("slowest stage 1: 4.050 ms = 1.071 x the ideal 3.780 ms"), std::string::npos)
      << table;
}

TEST(Partition, PlanByParametersAndByHand) {
  const PartitionPlan byParams = train::pipeline::planByParameters(exampleLayers(), 3);
  EXPECT_EQ(byParams.method, "parameters");
  EXPECT_EQ(byParams.boundaries.front(), 0);
  EXPECT_EQ(byParams.boundaries.back(), 9);
  const PartitionPlan manual = train::pipeline::planFromBoundaries(exampleLayers(), {0, 2, 8});
  EXPECT_EQ(manual.method, "manual");
  EXPECT_EQ(manual.boundaries, (Boundaries{0, 2, 8, 9}));
  EXPECT_NE(manual.describe().find("head [8]"), std::string::npos) << manual.describe();
  expectOneLineError(invalidArgumentOf([] {
                       train::pipeline::planFromBoundaries(exampleLayers(), {0, 9});
                     }),
                     "beyond the last layer 8");
}

// Interleaved pipelines: p ranks x v chunks is a cut into p * v pieces.
TEST(Partition, InterleavedChunksAreMorePieces) {
  std::vector<LayerInfo> layers;
  for (int i = 0; i < 16; ++i) layers.push_back({fmt::format("l{}", i), 10, 1.0, 64});
  const int ranks = 4, chunks = 2;
  const PartitionPlan plan = train::pipeline::planByTime(layers, ranks * chunks);
  ASSERT_EQ(plan.stages(), 8);
  for (int s = 0; s < plan.stages(); ++s) EXPECT_EQ(plan.end(s) - plan.begin(s), 2) << s;
  EXPECT_DOUBLE_EQ(plan.imbalance(), 1.0);
}

// The advice after training: stage 1 measured twice its profile, so half its layers move.
TEST(SplitAdvice, MovesLayersOffTheStageThatMeasuredSlow) {
  // 8 layers profiled at 1 ms each, cut 4 + 4; stage 1 measured 8 ms against stage 0's 4.
  const std::vector<double> profiled(8, 1.0);
  const auto a = train::pipeline::adviseSplit(profiled, {0, 4, 8}, {4.0, 8.0});
  EXPECT_TRUE(a.better());
  // Rescaled: stage 0's layers cost 1, stage 1's 2; the best cut is 5 + 3 (5 and 6 ms).
  EXPECT_EQ(a.suggested, (Boundaries{0, 5, 8}));
  EXPECT_DOUBLE_EQ(a.suggestedSlowestMs, 6.0);
  EXPECT_DOUBLE_EQ(a.currentSlowestMs, 8.0);
  EXPECT_NE(a.describe().find("boundaries = {5}"), std::string::npos) << a.describe();
  // Profiled costs weigh the stage's time: stage 1's last layer keeps 7 of its 9 ms, so only
  // its last layer stays there (spread evenly, the cut would be 4 + 2).
  const auto weighted = train::pipeline::adviseSplit({1, 1, 1, 1, 1, 7}, {0, 3, 6}, {3.0, 9.0});
  EXPECT_EQ(weighted.suggested, (Boundaries{0, 5, 6}));
  EXPECT_DOUBLE_EQ(weighted.suggestedSlowestMs, 7.0);
  // Balanced measurements: nothing to gain, the split stays.
  const auto even = train::pipeline::adviseSplit(profiled, {0, 4, 8}, {5.0, 5.1});
  EXPECT_FALSE(even.better());
  EXPECT_EQ(even.suggested, (Boundaries{0, 4, 8}));
  EXPECT_NE(even.describe().find("as good as any"), std::string::npos) << even.describe();
  // Not profiled (split by parameters or by hand): each stage's time spread evenly.
  const auto flat =
      train::pipeline::adviseSplit(std::vector<double>(6, 0.0), {0, 3, 6}, {3.0, 9.0});
  EXPECT_EQ(flat.suggested, (Boundaries{0, 4, 6}));  // 3 + 3 = 6 ms and 6 ms
  // Sizes that do not fit: one line.
  expectOneLineError(invalidArgumentOf([] {
                       train::pipeline::adviseSplit({1, 1}, {0, 1, 2}, {1.0});
                     }),
                     "1 measurements for a split of 3 boundaries");
  expectOneLineError(invalidArgumentOf([] {
                       train::pipeline::adviseSplit({1, 1}, {0, 2}, {-1.0});
                     }),
                     "finite and >= 0");
}

// Interleaved (2 ranks x 2 chunks): judged by each rank's sum of its chunks. Virtual stage 3
// (rank 1's second chunk) measured 6 ms for 2 layers, the others 2: rank 1 carries 8 ms, rank 0
// 4. Rescaled, the layers cost 1, 1, 1, 1, 1, 1, 3, 3 (14 ms); cut into 4 virtual stages the
// slowest is 3 ms, and the ranks carry at most 6.
TEST(SplitAdvice, InterleavedIsJudgedByEachRanksChunks) {
  const std::vector<double> profiled(8, 1.0);
  const auto a = train::pipeline::adviseSplit(profiled, {0, 2, 4, 6, 8}, {2, 2, 2, 6}, 2);
  EXPECT_EQ(train::pipeline::rankLoads({2, 2, 2, 6}, 2), (std::vector<double>{4, 8}));
  EXPECT_DOUBLE_EQ(a.currentSlowestMs, 8.0);
  EXPECT_TRUE(a.better());
  EXPECT_EQ(a.suggested.size(), 5u);
  EXPECT_LE(a.suggestedSlowestMs, 6.0);
  EXPECT_NE(a.describe().find("virtual stages measured 2.00, 2.00, 2.00, 6.00 ms per step, 2 "
                              "chunks per rank: ranks 4.00, 8.00 ms (slowest: rank 1"),
            std::string::npos)
      << a.describe();
  // Virtual stages that are uneven but whose ranks' sums are equal: nothing to gain.
  const auto even = train::pipeline::adviseSplit(profiled, {0, 2, 4, 6, 8}, {2, 4, 4, 2}, 2);
  EXPECT_DOUBLE_EQ(even.currentSlowestMs, 6.0);
  EXPECT_FALSE(even.better());
  expectOneLineError(invalidArgumentOf([] {
                       train::pipeline::adviseSplit({1, 1, 1}, {0, 1, 2, 3}, {1, 1, 1}, 2);
                     }),
                     "3 virtual stages are not 2 chunks per rank");
}

}  // namespace
}  // namespace shoal::test
