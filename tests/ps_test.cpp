// Parameter servers: the partition, the server-side optimizer, and whole jobs of real server and
// worker processes under `shoal run --servers`.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>

#include "common/sealed_file.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/server_optimizer.h"
#include "ps/shard.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

// ---- partition

TEST(PsPartition, BalancesBytesSplitsLargeKeysAndKeepsSmallOnesWhole) {
  std::vector<ps::KeySpec> keys{{"conv.w", {32, 1, 5, 5}},
                                {"conv.b", {32}},
                                {"fc.w", {128, 1568}},
                                {"fc.b", {128}},
                                {"out.w", {10, 128}}};
  ps::Partition p(keys, 3);
  size_t covered = 0;
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(p.begin(s), covered);
    size_t inPieces = 0;
    for (const auto& piece : p.pieces(s)) inPieces += piece.count;
    EXPECT_EQ(inPieces, p.elements(s));
    covered = p.end(s);
    // Balanced to within one small key of a third.
    EXPECT_NEAR(static_cast<double>(p.elements(s)), p.totalElements() / 3.0, 1400.0);
  }
  EXPECT_EQ(covered, p.totalElements());
  EXPECT_EQ(p.piecesOf(p.find("fc.w")).size(), 3u) << p.describe();
  EXPECT_EQ(p.piecesOf(p.find("conv.b")).size(), 1u);
  // Deterministic, and the description names the slices.
  ps::Partition again(keys, 3);
  EXPECT_EQ(p.describe(), again.describe());
  EXPECT_NE(p.describe().find("fc.w[0:"), std::string::npos) << p.describe();
}

TEST(PsPartition, MoreServersThanKeysLeavesSomeEmpty) {
  ps::Partition p({{"a", {3}}, {"b", {2}}}, 4);
  size_t total = 0;
  for (int s = 0; s < 4; ++s) total += p.elements(s);
  EXPECT_EQ(total, 5u);
  EXPECT_NE(p.describe().find("(nothing)"), std::string::npos);
}

TEST(PsPartition, RefusesBadKeysAndRoundTripsTheirText) {
  EXPECT_THROW(ps::Partition({{"a", {3}, DataType::kFloat64}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a", {3}}, {"a", {4}}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a b", {3}}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a", {3}}}, 0), InvalidArgument);
  ps::Partition p({{"w", {4, 5}}, {"bn.mean", {5}, DataType::kFloat32, ps::KeyKind::kState}}, 2);
  EXPECT_EQ(p.firstDifference(ps::Partition::parseKeys(p.keysText())), "");
  auto other = ps::Partition::parseKeys(p.keysText());
  other[0].shape = {5, 4};
  EXPECT_NE(p.firstDifference(other).find("'w' float32 [4, 5] here but 'w' float32 [5, 4]"),
            std::string::npos);
  EXPECT_THROW(ps::Partition::parseKeys("w 0 float32 2 4\n"), ProtocolError);
}

TEST(PsConfig, RoundTripsAndRefusesNonsense) {
  ps::TrainingConfig c;
  c.mode = ps::Mode::kSsp;
  c.staleness = 3;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.lr = 0.001;
  c.warmupSteps = 10;
  EXPECT_EQ(ps::TrainingConfig::parse(c.toText()).toText(), c.toText());
  EXPECT_EQ(ps::parseMode("ps-async"), ps::Mode::kAsync);
  EXPECT_THROW(ps::parseMode("eventual"), InvalidArgument);
  EXPECT_THROW(ps::TrainingConfig::parse("mode=sync"), ProtocolError);
  c.optimizer.lr = -1;
  EXPECT_THROW(c.validate(), InvalidArgument);
}

// ---- the server's optimizer against the formulas written out

TEST(PsOptimizer, SgdMomentumAdamAndRmspropFollowTheirFormulas) {
  const float g[2] = {0.5f, -2.0f};
  {
    OptimizerOptions o{OptimizerKind::kSgd, 0.1, 0.9, 0.01};
    float p[2] = {1.0f, 2.0f}, m[2] = {0, 0};
    ps::applyUpdate(o, 0.1, 1, 1.0f, g, p, m, nullptr, 2);
    ps::applyUpdate(o, 0.1, 2, 1.0f, g, p, m, nullptr, 2);
    // Step 1: d = g + wd p; m = d; p -= lr m. Step 2: m = 0.9 m + d'.
    double p0 = 1.0, m0 = 0.5 + 0.01 * 1.0;
    p0 -= 0.1 * m0;
    m0 = 0.9 * m0 + (0.5 + 0.01 * p0);
    p0 -= 0.1 * m0;
    EXPECT_NEAR(p[0], p0, 1e-6);
  }
  {
    OptimizerOptions o{OptimizerKind::kAdam, 0.01, 0, 0};
    float p[2] = {1.0f, 2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    ps::applyUpdate(o, 0.01, 1, 0.5f, g, p, m, v, 2);
    // First Adam step moves every parameter by lr against the gradient's sign.
    EXPECT_NEAR(p[0], 1.0 - 0.01, 1e-6);
    EXPECT_NEAR(p[1], 2.0 + 0.01, 1e-6);
  }
  {
    OptimizerOptions o{OptimizerKind::kRmsprop, 0.01, 0, 0};
    float p[2] = {1.0f, 2.0f}, s[2] = {0, 0};
    ps::applyUpdate(o, 0.01, 1, 1.0f, g, p, s, nullptr, 2);
    const double sq = 0.01 * 0.25;
    EXPECT_NEAR(p[0], 1.0 - 0.01 * 0.5 / (std::sqrt(sq) + 1e-8), 1e-6);
  }
}

TEST(PsShard, SynchronousStepsAverageInWorkerOrderAndSnapshotsRestore) {
  ps::Partition p({{"w", {6}}}, 1);
  ps::TrainingConfig c;
  c.optimizer = {OptimizerKind::kSgd, 1.0, 0, 0};
  ps::Shard shard(p, 0, 3, c);
  for (int w = 0; w < 3; ++w) std::fill(shard.slot(w), shard.slot(w) + 6, float(w + 1));
  EXPECT_FALSE(shard.arrive(2, 0, 1));
  EXPECT_FALSE(shard.arrive(0, 0, 1));
  EXPECT_TRUE(shard.arrive(1, 0, 1));
  EXPECT_EQ(shard.version(0), 1u);
  EXPECT_FLOAT_EQ(shard.values()[3], -2.0f);
  const std::string snap = shard.snapshot("header", 1, {1, 1, 1});
  ps::Shard fresh(p, 0, 3, c);
  uint64_t round = 0;
  std::vector<uint64_t> clocks;
  EXPECT_EQ(fresh.restore(snap, round, clocks), "header");
  EXPECT_EQ(round, 1u);
  EXPECT_FLOAT_EQ(fresh.values()[5], -2.0f);
  EXPECT_EQ(fresh.version(0), 1u);
  ps::Shard twoWorkers(p, 0, 2, c);
  EXPECT_THROW(twoWorkers.restore(snap, round, clocks), InvalidArgument);
  EXPECT_THROW(fresh.restore(snap.substr(0, snap.size() - 3), round, clocks), InvalidArgument);
}

// ---- whole jobs

RunResult psJob(const std::vector<std::string>& launch, const std::vector<std::string>& program,
                const TempDir& dir, std::chrono::seconds timeout = 300s) {
  std::vector<std::string> args = launch;
  args.insert(args.end(), {"--timeout", "60", "--", SHOAL_PS_WORKER});
  args.insert(args.end(), program.begin(), program.end());
  return shoalRun(SHOAL_BIN, args, dir, timeout);
}

// Lines "[r] <text>" of the workers 0..n-1 that contain `what`.
int workersSaying(const std::string& output, int n, const std::string& what) {
  int count = 0;
  for (int r = 0; r < n; ++r) {
    std::regex line("\\[" + std::to_string(r) + "\\] [^\n]*" +
                    std::regex_replace(what, std::regex(R"([\[\]\(\)\.\*\+\?])"), R"(\$&)"));
    if (std::regex_search(output, line)) ++count;
  }
  return count;
}

TEST(PsJob, NoUpdateIsLostUnderSixteenWorkersPushingConcurrently) {
  TempDir dir;
  auto r = psJob({"-n", "16", "--servers", "2"}, {"sums", "--pushes", "2000"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(workersSaying(r.output, 16, "sums exact over 20097 elements after 2000 pushes"), 16)
      << r.output;
  EXPECT_EQ(r.output.find("WRONG"), std::string::npos) << r.output;
}

int largestLead(const std::string& output, int workers) {
  int most = -1;
  std::regex lead(R"(\[(\d+)\] lead max (\d+))");
  for (std::sregex_iterator it(output.begin(), output.end(), lead), end; it != end; ++it) {
    if (std::stoi((*it)[1]) < workers) most = std::max(most, std::stoi((*it)[2]));
  }
  return most;
}

TEST(PsJob, StalenessBoundHoldsWithASlowWorker) {
  TempDir dir;
  auto r = psJob({"-n", "4", "--servers", "2"},
                 {"staleness", "--mode", "ssp", "--staleness", "2", "--steps", "40"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  // Bounded, and the bound was reached (the fast workers did wait on the slow one).
  EXPECT_EQ(largestLead(r.output, 4), 2) << r.output;
  EXPECT_EQ(workersSaying(r.output, 4, "lead max"), 4) << r.output;
  // Without the bound the same job runs far ahead: the bound is what held it.
  TempDir free;
  auto a = psJob({"-n", "4", "--servers", "2"},
                 {"staleness", "--mode", "async", "--staleness", "0", "--steps", "40"}, free);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_GT(largestLead(a.output, 4), 5) << a.output;
}

TEST(PsJob, AWrongShapeOrDtypeIsRefusedAndTheServerKeepsServing) {
  TempDir dir;
  auto r = psJob({"-n", "3", "--servers", "2"}, {"reject"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(workersSaying(r.output, 3, "reject ok"), 3) << r.output;
  EXPECT_NE(r.output.find("refused as expected: parameter server 0 refused the push: worker 1: "
                          "push step 2: key 'w' is float32 [4, 5]; got float32 [5, 4]"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("got float64 [4, 5]"), std::string::npos) << r.output;
}

std::string finalDigest(const std::string& output) {
  std::smatch m;
  std::regex d(R"(\[0\] final digest ([0-9a-f]+))");
  return std::regex_search(output, m, d) ? m[1].str() : "";
}

TEST(PsJob, AKilledServerFailsTheWorkersFastAndResumeFinishesExactly) {
  TempDir clean;
  auto whole = psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", clean.path}, clean);
  ASSERT_EQ(whole.code, 0) << whole.output;
  const std::string expected = finalDigest(whole.output);
  ASSERT_FALSE(expected.empty()) << whole.output;

  TempDir dir;
  auto killed = psJob({"-n", "2", "--servers", "2"},
                      {"train", "--dir", dir.path, "--kill-server-at", "12"}, dir);
  EXPECT_NE(killed.code, 0) << killed.output;
  EXPECT_LT(killed.seconds, 40) << killed.output;
  // Both workers name the dead server.
  EXPECT_EQ(workersSaying(killed.output, 2, "ERROR PeerError: parameter server 1: push-pull step"),
            2)
      << killed.output;
  EXPECT_NE(killed.output.find("killed by signal 9"), std::string::npos) << killed.output;

  auto resumed =
      psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", dir.path, "--resume"}, dir);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(step 10)"), std::string::npos) << resumed.output;
  EXPECT_EQ(workersSaying(resumed.output, 2, "resumes at step 10"), 2) << resumed.output;
  EXPECT_EQ(finalDigest(resumed.output), expected) << resumed.output;
}

}  // namespace
}  // namespace shoal::test
