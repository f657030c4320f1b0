// The timeline's clocks: offsets recovered from emulated skews between thread ranks, and a
// 4-rank `shoal run` with SHOAL_TRACE whose merged trace holds every collective on every rank
// and aligns its barriers within the stated error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/clock_sync.h"
#include "comm/collectives.h"
#include "common/error.h"
#include "common/trace_file.h"
#include "run/trace_merge.h"
#include "run/trace_session.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"
#include "tests/trace_util.h"

namespace shoal::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

TEST(ClockSync, RecoversEmulatedSkewsAndTheMergedTraceAlignsBarriers) {
  constexpr int n = 4;
  constexpr int kBarriers = 101;
  // Rank r's clock runs skew[r] ahead of rank 0's: the hosts of an emulated cluster.
  const int64_t skew[n] = {0, 37'000'000, -52'000'000, 3'000'000'000};
  TempDir dir, wrong;
  std::vector<std::shared_ptr<TraceSink>> sinks;
  for (int r = 0; r < n; ++r) {
    sinks.push_back(std::make_shared<TraceSink>(TraceSinkOptions{.clockSkewNs = skew[r]}));
  }
  std::vector<comm::ClockOffset> offsets(n);
  auto infoOf = [&](int r) {
    return RankTraceInfo{.rank = r,
                         .host = fmt::format("host{}", r),
                         .clockOffsetNs = offsets[r].offsetNs,
                         .clockErrorNs = offsets[r].errorNs};
  };
  auto errors = runTracedRanks(sinks, [&](comm::Group& g) {
    const int r = g.rank();
    offsets[r] = comm::measureClockOffset(g, {.clock = [s = sinks[r]] { return s->now(); }});
    for (int i = 0; i < kBarriers; ++i) comm::barrier(g);
    writeRankTrace(*sinks[r], infoOf(r), dir.path + "/" + run::rankTraceFileName(r));
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  int64_t maxError = 0;
  for (const auto& o : offsets) maxError = std::max(maxError, o.errorNs);
  // The same spans with rank 3's offset wrong (its bound unchanged) by 2 ms beyond twice the
  // bounds of any pair with it: the causality check must see it. Beyond the bounds, not by a
  // fixed amount: under load a bound itself reaches milliseconds (the best of 16 round trips
  // between threads that wait for a core; 6 ms seen beside 4 CPU-bound processes), and a clock
  // wrong within its bound is no error.
  for (int r = 0; r < n; ++r) {
    RankTraceInfo info = infoOf(r);
    if (r == 3) info.clockOffsetNs += 2'000'000 + 2 * (offsets[3].errorNs + maxError);
    writeRankTrace(*sinks[r], info, wrong.path + "/" + run::rankTraceFileName(r));
  }
  EXPECT_EQ(offsets[0].offsetNs, 0);
  EXPECT_EQ(offsets[0].errorNs, 0);
  for (int r = 1; r < n; ++r) {
    // One physical clock: the true offset is -skew exactly, and the bound must contain it.
    EXPECT_LE(std::llabs(offsets[r].offsetNs + skew[r]), offsets[r].errorNs)
        << "rank " << r << ": offset " << offsets[r].offsetNs << " +/- " << offsets[r].errorNs;
    EXPECT_GT(offsets[r].errorNs, 0);
    EXPECT_LT(offsets[r].errorNs, 50'000'000) << "a round trip of 100 ms between threads";
  }

  const auto summary = run::mergeTraceDir(dir.path, dir.path + "/job.json");
  EXPECT_EQ(summary.ranks, n);
  EXPECT_TRUE(summary.missingRanks.empty());
  EXPECT_EQ(summary.alignmentErrorNs, maxError);
  const Merged m = readMerged(dir.path + "/job.json");
  EXPECT_EQ(m.processNames.at(3), "rank 3 (host3)");
  expectSameCollectives(m, n);
  expectBarriersAligned(m, kBarriers);

  run::mergeTraceDir(wrong.path, wrong.path + "/job.json");
  EXPECT_FALSE(causalityViolations(readMerged(wrong.path + "/job.json")).empty())
      << "a clock 2 ms beyond its bounds went unnoticed";
}

TEST(ClockSync, AGroupOfOneHasNoOffset) {
  auto errors = runThreadRanks(1, testOptions(TransportKind::kAuto), [](comm::Group& g) {
    const auto o = comm::measureClockOffset(g);
    SHOAL_CHECK_EQ(o.offsetNs, 0, "offset");
    SHOAL_CHECK_EQ(o.errorNs, 0, "error");
    EXPECT_THROW(comm::measureClockOffset(g, {.rounds = 0}), InvalidArgument);
  });
  EXPECT_EQ(errors[0], "");
}

// ---- Real processes: shoal run --trace FILE (SHOAL_TRACE for the ranks, then the merge)

TEST(Timeline, AFourRankJobMergesIntoOneAlignedTrace) {
  constexpr int n = 4;
  constexpr int kBarriers = 101;
  TempDir dir;
  const std::string out = dir.path + "/job.json";
  // A rank file left by an earlier job must not be merged into this one.
  std::filesystem::create_directories(out + ".ranks");
  std::ofstream(out + ".ranks/trace.rank7.json") << "{}";
  const auto r = shoalRun(SHOAL_BIN,
                          {"-n", std::to_string(n), "--timeout", "60", "--trace", out, "--",
                           SHOAL_TRACE_WORKER, std::to_string(kBarriers)},
                          dir, 120s);
  ASSERT_EQ(r.code, 0) << r.output;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(r.output.find(fmt::format("TRACE_WORKER rank {} of {} done", rank, n)),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find(fmt::format("timeline of {} ranks in {}", n, out)), std::string::npos)
      << r.output;
  EXPECT_EQ(run::rankTraceFiles(out + ".ranks").size(), static_cast<size_t>(n));
  const Merged m = readMerged(out);
  EXPECT_TRUE(m.doc.at("otherData").at("missing_ranks").empty());
  EXPECT_EQ(m.doc.at("otherData").at("dropped"), 0);
  ASSERT_EQ(m.spans.size(), static_cast<size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(m.processNames.at(rank).rfind(fmt::format("rank {} (", rank), 0), 0u);
  }
  EXPECT_EQ(m.doc.at("otherData").at("ranks"), n);
  // Same host: the offset is within its bound of 0, and the bound is a round trip between
  // processes, far below a millisecond unless the machine is very busy.
  for (const json& pr : m.doc.at("otherData").at("per_rank")) {
    EXPECT_LE(std::llabs(pr.at("clock_offset_ns").get<int64_t>()),
              pr.at("clock_error_ns").get<int64_t>())
        << pr.dump();
  }
  expectSameCollectives(m, n);
  // The collectives the worker ran, by name, each on every rank.
  std::map<std::string, int> count;
  for (const json& e : m.spans.at(0)) {
    if (e.at("cat") == "comm") ++count[e.at("name").get<std::string>()];
  }
  EXPECT_EQ(count["allreduce"], 4);
  EXPECT_EQ(count["broadcast"], 1);
  EXPECT_EQ(count["allgather"], 1);
  EXPECT_EQ(count["barrier"], kBarriers);
  expectBarriersAligned(m, kBarriers);
}

}  // namespace
}  // namespace shoal::test
