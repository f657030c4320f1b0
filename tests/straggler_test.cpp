// Straggler detection (comm/straggler_monitor.h) on thread ranks fed known phase times: the
// persistently slow rank and its phase are named, on every rank alike; one slow window, a rank
// that recovers and phases too short to judge are not; bad options and inputs are refused.
#include <gtest/gtest.h>

#include <mutex>

#include "comm/straggler_monitor.h"
#include "common/error.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

// Runs `steps` steps on 4 thread ranks; `times(rank, step)` gives the phase times. Returns each
// rank's reports.
std::vector<std::vector<comm::StragglerReport>> monitor(
    const comm::StragglerOptions& o, int steps,
    const std::function<std::vector<double>(int rank, int step)>& times) {
  std::vector<std::vector<comm::StragglerReport>> reports(4);
  std::mutex mutex;
  const auto errors = runThreadRanks(4, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
    comm::StragglerMonitor m(g.shared_from_this(), o);
    for (int s = 0; s < steps; ++s) {
      const auto t = times(g.rank(), s);
      if (auto r = m.step(t)) {
        std::lock_guard lock(mutex);
        reports[g.rank()].push_back(*r);
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return reports;
}

TEST(Stragglers, APersistentlySlowRankIsNamedWithItsPhaseOnEveryRank) {
  comm::StragglerOptions o{.phases = {"compute", "data"}, .window = 5, .persist = 2};
  // Rank 2 computes twice as long; data loading is the same everywhere.
  const auto reports = monitor(o, 15, [](int rank, int) {
    return std::vector<double>{rank == 2 ? 0.04 : 0.02, 0.005};
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(reports[r].size(), 3u) << r;
    EXPECT_TRUE(reports[r][0].stragglers.empty()) << "one window is not persistent";
    ASSERT_EQ(reports[r][1].stragglers.size(), 1u) << r;
    const auto& s = reports[r][1].stragglers[0];
    EXPECT_EQ(s.rank, 2);
    EXPECT_EQ(s.phase, "compute");
    EXPECT_DOUBLE_EQ(s.seconds, 0.04);
    EXPECT_DOUBLE_EQ(s.medianSeconds, 0.02);
    EXPECT_EQ(reports[r][1].step, 10);
    EXPECT_EQ(reports[r][1].means[0][2], 0.04);
    EXPECT_EQ(reports[r][1].describe(),
              "rank 2: compute 40.0 ms per step, 2.0x the median 20.0 ms");
    EXPECT_EQ(reports[r][2].stragglers.size(), 1u);
  }
}

TEST(Stragglers, OneSlowWindowAndARecoveredRankAreNotNamed) {
  comm::StragglerOptions o{.window = 4, .persist = 2};
  // Rank 1 is slow in the first window only; rank 3 in windows 2 and 3, then recovers.
  const auto reports = monitor(o, 20, [](int rank, int step) {
    const int window = step / 4;
    const bool slow = (rank == 1 && window == 0) || (rank == 3 && (window == 1 || window == 2));
    return std::vector<double>{slow ? 0.05 : 0.01};
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(reports[r].size(), 5u);
    EXPECT_TRUE(reports[r][0].stragglers.empty());
    EXPECT_TRUE(reports[r][1].stragglers.empty());
    ASSERT_EQ(reports[r][2].stragglers.size(), 1u);
    EXPECT_EQ(reports[r][2].stragglers[0].rank, 3);
    EXPECT_TRUE(reports[r][3].stragglers.empty()) << "rank 3 recovered";
    EXPECT_EQ(reports[r][3].describe(), "no straggler");
  }
}

TEST(Stragglers, PhasesTooShortToJudgeAndRanksWithinTheThresholdAreNot) {
  comm::StragglerOptions o{.phases = {"tiny", "close"}, .window = 3, .persist = 1};
  const auto reports = monitor(o, 6, [](int rank, int) {
    // 10 us against 1 us: below minSeconds. 12 ms against 10 ms: within 1.3x.
    return std::vector<double>{rank == 0 ? 1e-5 : 1e-6, rank == 0 ? 0.012 : 0.010};
  });
  for (int r = 0; r < 4; ++r) {
    for (const auto& report : reports[r]) EXPECT_TRUE(report.stragglers.empty());
  }
}

TEST(Stragglers, BadOptionsAndInputsAreRefused) {
  const auto errors = runThreadRanks(1, testOptions(TransportKind::kTcp), [](comm::Group& g) {
    auto group = g.shared_from_this();
    EXPECT_THROW(comm::StragglerMonitor(group, {.phases = {}}), InvalidArgument);
    EXPECT_THROW(comm::StragglerMonitor(group, {.window = 0}), InvalidArgument);
    EXPECT_THROW(comm::StragglerMonitor(group, {.threshold = 1.0}), InvalidArgument);
    EXPECT_THROW(comm::StragglerMonitor(group, {.persist = 0}), InvalidArgument);
    comm::StragglerMonitor m(group, {.phases = {"compute", "data"}});
    EXPECT_THROW(m.step(0.1), InvalidArgument);  // one time for two phases
    const double nan[2] = {std::nan(""), 0};
    EXPECT_THROW(m.step(nan), InvalidArgument);
    const double negative[2] = {-1, 0};
    EXPECT_THROW(m.step(negative), InvalidArgument);
  });
  EXPECT_EQ(errors[0], "");
}

}  // namespace
}  // namespace shoal::test
