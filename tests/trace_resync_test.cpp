// The timeline over a long job (Note [Clock resynchronisation] in run/trace_session.h): the
// offset interpolated between measurements (common/clock_map.h), its use by the merge, thread
// ranks whose emulated clocks drift apart and stay aligned only through resync(), and a last
// measurement that gives up on a peer that left instead of hanging.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "comm/collectives.h"
#include "common/clock_map.h"
#include "common/error.h"
#include "common/trace_file.h"
#include "run/trace_merge.h"
#include "run/trace_session.h"
#include "tests/process_util.h"
#include "tests/trace_util.h"

namespace shoal::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(TraceSink, AnEmulatedDriftRunsTheClockFasterAndAnAbsurdOneIsRefused) {
  TraceSink sink({.clockSkewNs = 5'000'000, .clockDrift = 0.1});
  // Each sink reading between two steady ones: whatever the scheduler does, the sink's time
  // moved 1.1 times as far as the steady clock between some instants in those brackets.
  const int64_t lo1 = steadyNs(), s1 = sink.now(), hi1 = steadyNs();
  while (steadyNs() - hi1 < 2'000'000) {
    // 2 ms pass (not a wait for anything: the clocks only need to move apart).
  }
  const int64_t lo2 = steadyNs(), s2 = sink.now(), hi2 = steadyNs();
  EXPECT_GE(s2 - s1, 1.1 * static_cast<double>(lo2 - hi1) - 2);
  EXPECT_LE(s2 - s1, 1.1 * static_cast<double>(hi2 - lo1) + 2);
  EXPECT_GE(s1 - lo1, 5'000'000);  // the skew is there from the start
  EXPECT_THROW(TraceSink({.clockDrift = 0.5}), InvalidArgument);
  EXPECT_THROW(TraceSink({.clockDrift = -0.7}), InvalidArgument);
}

TEST(ClockMap, InterpolatesBetweenMeasurementsAndHoldsOutsideThem) {
  const ClockMap map({{1000, 100, 5}, {3000, 300, 7}, {5000, 200, 2}});
  int64_t error = -1;
  EXPECT_DOUBLE_EQ(map.offsetAt(2000, &error), 200);
  EXPECT_EQ(error, 7);  // the worse of the two measurements around it
  EXPECT_DOUBLE_EQ(map.offsetAt(4500, &error), 225);
  EXPECT_EQ(error, 7);
  EXPECT_DOUBLE_EQ(map.offsetAt(-1e9, &error), 100);  // before the first: held
  EXPECT_EQ(error, 5);
  EXPECT_DOUBLE_EQ(map.offsetAt(9000, &error), 200);  // after the last: held
  EXPECT_EQ(error, 2);
  EXPECT_DOUBLE_EQ(ClockMap({}).offsetAt(123, &error), 0);
  EXPECT_EQ(error, 0);
  EXPECT_DOUBLE_EQ(ClockMap({{10, -4, 1}}).offsetAt(0), -4);
}

TEST(ClockMap, RefusesMeasurementsOutOfOrderOrWithANegativeBound) {
  EXPECT_THROW(ClockMap({{2000, 0, 1}, {1000, 0, 1}}), InvalidArgument);
  EXPECT_THROW(ClockMap({{1000, 0, -1}}), InvalidArgument);
  // Two at one instant are in order (a step, not a slope).
  const ClockMap step({{1000, 0, 1}, {1000, 50, 1}});
  EXPECT_DOUBLE_EQ(step.offsetAt(1000), 50);
}

// A span [beginNs, endNs) of the sink's clock, and an asynchronous one, in a rank file with
// `samples`; what the merge makes of their times.
TEST(TraceMergeClock, MapsEveryTimeThroughTheMeasurementsAroundIt) {
  TempDir dir;
  TraceSpan span;
  span.name = "allreduce";
  span.category = "comm";
  span.beginNs = 500'000;
  span.endNs = 600'000;
  TraceSpan message = span;
  message.name = "send";
  message.asyncId = 7;
  const RankTraceInfo info{.rank = 1,
                           .host = "h",
                           .clockOffsetNs = 1000,
                           .clockErrorNs = 10,
                           .clockSamples = {{0, 1000, 10}, {1'000'000, 3000, 20}}};
  writeFileAtomically(dir.path + "/trace.rank1.json",
                      rankTraceJson({span, message}, info, 2, 0, 16));
  // The same spans in a file of one offset, as written before "clock_sync" existed.
  RankTraceInfo old = info;
  old.rank = 0;
  old.clockSamples.clear();
  json doc = json::parse(rankTraceJson({span}, old, 1, 0, 16));
  doc["otherData"].erase("clock_sync");
  writeFileAtomically(dir.path + "/trace.rank0.json", doc.dump());

  const auto s = run::mergeTraceDir(dir.path, dir.path + "/job.json");
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.alignmentErrorNs, 20);  // rank 1's times lie between both of its measurements
  const json merged = json::parse(readFile(dir.path + "/job.json"));
  std::map<std::pair<int, std::string>, json> byRankAndPhase;
  for (const json& e : merged.at("traceEvents")) {
    if (e.at("ph") != "M") byRankAndPhase[{e.at("pid").get<int>(), e.at("ph")}] = e;
  }
  // Offset at 500 us: 1000 + 0.5 x 2000 = 2000 ns; at 600 us: 2200 ns.
  EXPECT_NEAR(byRankAndPhase.at({1, "X"}).at("ts").get<double>(), 502.0, 1e-6);
  EXPECT_NEAR(byRankAndPhase.at({1, "X"}).at("dur").get<double>(), 100.2, 1e-6);
  EXPECT_NEAR(byRankAndPhase.at({1, "b"}).at("ts").get<double>(), 502.0, 1e-6);
  EXPECT_NEAR(byRankAndPhase.at({1, "e"}).at("ts").get<double>(), 602.2, 1e-6);
  // One offset: the times as the file has them.
  EXPECT_NEAR(byRankAndPhase.at({0, "X"}).at("ts").get<double>(), 501.0, 1e-6);
  EXPECT_NEAR(byRankAndPhase.at({0, "X"}).at("dur").get<double>(), 100.0, 1e-6);
  const json& perRank = merged.at("otherData").at("per_rank");
  ASSERT_EQ(perRank.size(), 2u);
  EXPECT_EQ(perRank[0].at("clock_measurements"), 0);
  EXPECT_EQ(perRank[0].at("clock_error_ns"), 10);
  EXPECT_EQ(perRank[1].at("clock_measurements"), 2);
  EXPECT_EQ(perRank[1].at("clock_drift_ns"), 2000);
  EXPECT_EQ(perRank[1].at("clock_error_ns"), 20);
}

// Barriers for at least `minimum` on rank 0's clock (rank 0 decides, the others learn it by
// broadcast: every rank runs the same count, which it returns). Time passes, so that the
// emulated clocks drift apart measurably; no rank waits on time.
int barriersFor(comm::Group& g, std::chrono::milliseconds minimum) {
  const auto start = std::chrono::steady_clock::now();
  for (int count = 0;; ++count) {
    int64_t more = g.rank() == 0 && std::chrono::steady_clock::now() - start < minimum ? 1 : 0;
    comm::broadcast(g, &more, 1, DataType::kInt64, 0);
    if (more == 0) return count;
    comm::barrier(g);
  }
}

TEST(ClockResync, DriftingClocksStayAlignedBetweenMeasurements) {
  constexpr int n = 3;
  // Rank r's clock runs skew[r] ahead of rank 0's and gains drift[r] per nanosecond: 10% and 4%
  // fast, far more than real clocks (~1e-5), so that a fraction of a second shows it beyond
  // any bound a loaded machine makes (40 ms on rank 1 by the end). (A fast clock keeps the NTP
  // bound conservative: a slow one would shrink the round trips measured on it by up to
  // |drift| of themselves.)
  const int64_t skew[n] = {0, 37'000'000, -52'000'000};
  const double drift[n] = {0, 0.1, 0.04};
  TempDir dir, single;
  std::vector<std::shared_ptr<TraceSink>> sinks;
  for (int r = 0; r < n; ++r) {
    sinks.push_back(std::make_shared<TraceSink>(
        TraceSinkOptions{.clockSkewNs = skew[r], .clockDrift = drift[r]}));
  }
  int barriers = 0;
  auto errors = runTracedRanks(sinks, [&](comm::Group& g) {
    run::TraceSession session(g.shared_from_this(), dir.path);  // measures at start-up
    int count = barriersFor(g, 200ms);
    const auto again = session.resync();
    SHOAL_CHECK(again.has_value(), "rank {}: resync measured nothing", g.rank());
    count += barriersFor(g, 200ms);
    if (g.rank() == 0) barriers = count;
    // The session measures once more as it goes, then writes.
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // Each rank's file: three measurements, whose offsets move as the drift says.
  for (int r = 0; r < n; ++r) {
    const std::string file = dir.path + "/" + run::rankTraceFileName(r);
    const json samples = json::parse(readFile(file)).at("otherData").at("clock_sync");
    ASSERT_EQ(samples.size(), 3u) << file;
    const json &first = samples.front(), &last = samples.back();
    const double elapsed = last.at("at_ns").get<double>() - first.at("at_ns").get<double>();
    EXPECT_GT(elapsed, 400e6) << "rank " << r;
    // Local time runs 1 + d times as fast, so the offset falls by d / (1 + d) of it.
    const double expected = -drift[r] / (1 + drift[r]) * elapsed;
    const double moved = last.at("offset_ns").get<double>() - first.at("offset_ns").get<double>();
    EXPECT_LE(std::abs(moved - expected),
              first.at("error_ns").get<double>() + last.at("error_ns").get<double>() + 2)
        << "rank " << r << ": offset moved " << moved << " ns, the drift says " << expected;
    // The same file with its start-up offset alone (as before resynchronisation).
    json doc = json::parse(readFile(file));
    doc["otherData"].erase("clock_sync");
    writeFileAtomically(single.path + "/" + run::rankTraceFileName(r), doc.dump());
  }

  const auto summary = run::mergeTraceDir(dir.path, dir.path + "/job.json");
  EXPECT_EQ(summary.ranks, n);
  const Merged m = readMerged(dir.path + "/job.json");
  for (const json& pr : m.doc.at("otherData").at("per_rank")) {
    EXPECT_EQ(pr.at("clock_measurements"), 3) << pr.dump();
  }
  expectSameCollectives(m, n);
  expectBarriersAligned(m, barriers);

  // One offset measured at start-up is off by the drift since (40 ms on rank 1 at the end),
  // far beyond its bound: the late barriers break causality.
  run::mergeTraceDir(single.path, single.path + "/job.json");
  const Merged stale = readMerged(single.path + "/job.json");
  const auto violations = causalityViolations(stale);
  EXPECT_FALSE(violations.empty()) << "a stale offset went unnoticed";
  if (!violations.empty())
    std::printf("with the start-up offset alone: %s\n", violations.back().c_str());
}

TEST(ClockResync, TheIntervalFormMeasuresOnMultiplesOfItsInterval) {
  auto sink = [] { return std::make_shared<TraceSink>(); };
  TempDir dir;
  auto errors = runTracedRanks({sink(), sink()}, [&](comm::Group& g) {
    run::TraceSession session(g.shared_from_this(), dir.path);
    int measured = 0;
    for (int64_t step = 0; step <= 10; ++step) measured += session.resyncEvery(step, 4) ? 1 : 0;
    SHOAL_CHECK_EQ(measured, 2, "resyncs at steps 4 and 8");
    SHOAL_CHECK_EQ(session.info().clockSamples.size(), size_t{3}, "measurements");
    EXPECT_THROW(session.resyncEvery(4, 0), InvalidArgument);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // A session whose clock is not measured (elastic) is never collective: one rank alone.
  TempDir unmeasured;
  errors = runTracedRanks({sink(), sink()}, [&](comm::Group& g) {
    run::TraceSession session(g.shared_from_this(), unmeasured.path, /*measureClock=*/false);
    if (g.rank() == 1) {
      SHOAL_CHECK(!session.resync().has_value(), "an unmeasured session measured");
      SHOAL_CHECK(!session.resyncEvery(4, 4), "an unmeasured session measured");
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// A job that resyncs very often keeps a bounded number of measurements, spread over the whole
// job: the first, the newest, and every other one between once full. (A group of one measures
// without a message, so thousands of resyncs take no time.)
TEST(ClockResync, MeasurementsStayBoundedAndSpanTheJob) {
  TempDir dir;
  auto errors = runTracedRanks({std::make_shared<TraceSink>()}, [&](comm::Group& g) {
    run::TraceSession session(g.shared_from_this(), dir.path);
    const ClockSample first = session.info().clockSamples.at(0);
    int64_t newest = 0;
    for (size_t i = 0; i < 2 * run::kMaxClockSamples + 10; ++i) newest = session.resync()->atNs;
    const auto samples = session.info().clockSamples;
    SHOAL_CHECK(samples.size() <= run::kMaxClockSamples, "{} measurements kept", samples.size());
    SHOAL_CHECK(samples.size() > run::kMaxClockSamples / 2, "{} measurements kept", samples.size());
    SHOAL_CHECK_EQ(samples.front().atNs, first.atNs, "the first measurement");
    SHOAL_CHECK_EQ(samples.back().atNs, newest, "the newest measurement");
    for (size_t i = 1; i < samples.size(); ++i) {
      SHOAL_CHECK(samples[i - 1].atNs <= samples[i].atNs, "measurement {} out of order", i);
    }
  });
  EXPECT_EQ(errors[0], "");
}

// A rank that fails leaves without its last measurement (it is unwinding), and the ranks that
// try to measure with it give up at once, note it, and still write their files: neither a hang
// until the timeout nor an exception out of a destructor.
TEST(ClockResync, AFailedPeerEndsTheMeasurementsWithoutAHang) {
  constexpr int n = 3;
  std::vector<std::shared_ptr<TraceSink>> sinks;
  for (int r = 0; r < n; ++r) sinks.push_back(std::make_shared<TraceSink>());
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  auto errors = runTracedRanks(sinks, [&](comm::Group& g) {
    run::TraceSession session(g.shared_from_this(), dir.path);
    if (g.rank() == 2) throw std::runtime_error("rank 2 fails");
    if (g.rank() == 0) {
      // Rank 2 never measures: rank 0 cannot serve it (whether rank 1 got its answer first
      // depends on when rank 2 left).
      EXPECT_THROW(session.resync(), Error);
      try {
        session.resync();
        ADD_FAILURE() << "a second resync after a failed one measured";
      } catch (const PeerError& e) {
        EXPECT_NE(std::string(e.what()).find("earlier clock measurement failed"), std::string::npos)
            << e.what();
      }
    } else {
      try {
        session.resync();
      } catch (const Error&) {
        // Rank 0 may have given up before answering.
      }
    }
    // The destructors: rank 0 no longer measures; rank 1 tries once more and gives up when
    // rank 0 leaves.
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(errors[2], "rank 2 fails");
  // The groups' timeout is 120 s (testOptions): what hung would have taken that long.
  EXPECT_LT(seconds, 60) << "the measurements waited for a peer that had left";
  std::map<int, size_t> samples;
  for (int r = 0; r < n; ++r) {
    const std::string file = dir.path + "/" + run::rankTraceFileName(r);
    ASSERT_TRUE(std::filesystem::exists(file)) << "rank " << r << " wrote no file";
    samples[r] = json::parse(readFile(file)).at("otherData").at("clock_sync").size();
  }
  EXPECT_EQ(samples[0], 1u) << "rank 0 measured with a rank that had failed";
  EXPECT_EQ(samples[2], 1u) << "rank 2 measured while unwinding";
  EXPECT_GE(samples[1], 1u);
  EXPECT_LE(samples[1], 3u);
  EXPECT_EQ(run::mergeTraceDir(dir.path, dir.path + "/job.json").ranks, n);
}

}  // namespace
}  // namespace shoal::test
