// Autotuning by successive halving (comm/autotuner.h) on thread ranks: with known step times the
// fastest candidate (by its slowest rank) wins on every rank within the stated budget; with real
// bucketed all-reduces the choice is within 5% of the best of a grid sweep; bad input refused.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>

#include "comm/autotuner.h"
#include "comm/collectives.h"
#include "common/error.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

TEST(Autotune, TheFastestCandidateBySlowestRankWinsOnEveryRank) {
  // Candidate 1 is the fastest on ranks 0-2 but slow on rank 3: a step waits for rank 3, so 3
  // (the second fastest everywhere) must win.
  const double ms[4][5] = {{9, 1, 5, 2, 7}, {9, 1, 5, 2, 7}, {9, 1, 5, 2, 7}, {9, 20, 5, 2, 7}};
  std::vector<size_t> chosen(4);
  std::vector<int> steps(4);
  std::vector<std::string> described(4);
  std::mutex mutex;
  const auto errors = runThreadRanks(4, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    comm::Autotuner t(g.shared_from_this(), {"a", "b", "c", "d", "e"},
                      {.warmupSteps = 1, .stepsPerRound = 2});
    int n = 0;
    while (!t.done()) {
      ++n;
      t.record(ms[g.rank()][t.current()] * 1e-3);
    }
    std::lock_guard lock(mutex);
    chosen[g.rank()] = t.best();
    steps[g.rank()] = n;
    described[g.rank()] = t.describe();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(chosen[r], 3u) << r;
    // 5 trials of 1 + 2 steps, 3 of 1 + 4, 2 of 1 + 8: 15 + 15 + 18.
    EXPECT_EQ(steps[r], 48) << r;
    EXPECT_EQ(described[r], described[0]);
  }
  EXPECT_EQ(described[0].rfind("chose d: d 2.00 ms per step (round 3, 8 steps); c 5.00 ms", 0), 0u)
      << described[0];
}

TEST(Autotune, WarmupStepsAreNotTimed) {
  const auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [](comm::Group& g) {
    comm::Autotuner t(g.shared_from_this(), {"slow start", "steady"},
                      {.warmupSteps = 1, .stepsPerRound = 3});
    int inTrial = 0;
    size_t last = t.current();
    while (!t.done()) {
      if (t.current() != last) inTrial = 0;
      last = t.current();
      // Candidate 0's first step of each trial takes a second, the rest 1 ms; candidate 1 always
      // 2 ms: without the warm-up rule candidate 1 would win.
      const double s = t.current() == 0 ? (inTrial == 0 ? 1.0 : 1e-3) : 2e-3;
      ++inTrial;
      t.record(s);
    }
    EXPECT_EQ(t.best(), 0u);
    ASSERT_EQ(t.trials().size(), 2u);
    EXPECT_DOUBLE_EQ(t.trials()[0].seconds, 1e-3);
    EXPECT_EQ(t.trials()[0].steps, 3);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// One "training step": all-reduce `floats` in buckets of `bucket` floats, as DDP would.
double bucketedStep(comm::Group& g, std::vector<float>& grads, size_t bucket) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t at = 0; at < grads.size(); at += bucket) {
    comm::allreduce(g, grads.data() + at, std::min(bucket, grads.size() - at), DataType::kFloat32,
                    ReduceOp::kSum);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Autotune, PicksABucketSizeWithinFivePercentOfTheGridSweepsBest) {
  // 2 MiB of gradients in buckets of 1 KiB, 16 KiB or all at once: per-operation costs make the
  // small buckets several times slower (bench/results: allreduce latency by size).
  const std::vector<size_t> buckets = {256, 4096, size_t{1} << 19};
  std::vector<double> sweep(buckets.size());
  size_t chosen = 0;
  std::mutex mutex;
  const auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    std::vector<float> grads(size_t{1} << 19, 1.0f);
    // The grid sweep: each bucket size's median over 5 steps (the slowest rank's).
    for (size_t c = 0; c < buckets.size(); ++c) {
      std::vector<double> t;
      for (int i = 0; i < 6; ++i) t.push_back(bucketedStep(g, grads, buckets[c]));
      std::sort(t.begin() + 1, t.end());
      double median = t[3];
      comm::allreduce(g, &median, 1, DataType::kFloat64, ReduceOp::kMax);
      std::lock_guard lock(mutex);
      sweep[c] = median;
    }
    comm::Autotuner tuner(g.shared_from_this(), {"1KiB", "16KiB", "2MiB"});
    while (!tuner.done()) tuner.record(bucketedStep(g, grads, buckets[tuner.current()]));
    std::lock_guard lock(mutex);
    chosen = tuner.best();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  const double best = *std::min_element(sweep.begin(), sweep.end());
  EXPECT_LE(sweep[chosen], 1.05 * best)
      << "chose " << chosen << "; sweep " << sweep[0] << " " << sweep[1] << " " << sweep[2];
}

TEST(Autotune, BadOptionsAndTimesAreRefused) {
  const auto errors = runThreadRanks(1, testOptions(TransportKind::kTcp), [](comm::Group& g) {
    auto group = g.shared_from_this();
    EXPECT_THROW(comm::Autotuner(group, {}), InvalidArgument);
    EXPECT_THROW(comm::Autotuner(group, {"a"}, {.stepsPerRound = 0}), InvalidArgument);
    EXPECT_THROW(comm::Autotuner(group, {"a"}, {.warmupSteps = -1}), InvalidArgument);
    comm::Autotuner one(group, {"only"});
    EXPECT_TRUE(one.done());
    EXPECT_EQ(one.best(), 0u);
    EXPECT_FALSE(one.record(1.0));
    comm::Autotuner two(group, {"a", "b"});
    EXPECT_THROW(two.best(), InvalidArgument);
    EXPECT_THROW(two.record(-1), InvalidArgument);
    EXPECT_THROW(two.record(std::nan("")), InvalidArgument);
  });
  EXPECT_EQ(errors[0], "");
}

}  // namespace
}  // namespace shoal::test
