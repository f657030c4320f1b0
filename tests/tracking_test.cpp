// Experiment tracking (track/): the metrics store's format checks and queries, the Tracker's
// flush deadline, drop accounting and error reporting, the system sampler, and real processes
// (tests/tracking_worker.cpp) writing one store at once, one of them killed mid-run.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "tests/process_util.h"
#include "track/metrics_store.h"
#include "track/system_sampler.h"
#include "track/tracker.h"

namespace shoal::track {
namespace {

using namespace std::chrono_literals;
using test::Proc;
using test::TempDir;

// A plain SQLite connection, independent of the code under test: how the tests look into the
// file, hold its write lock, or make files that are not ours.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    sqlite3_busy_timeout(db_, 30000);
  }
  ~RawDb() { sqlite3_close(db_); }
  void exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    ASSERT_EQ(rc, SQLITE_OK) << sql << ": " << (err ? err : "");
  }
  // Every row of a query, each as its columns' text (NULL as "NULL").
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    std::vector<std::vector<std::string>> out;
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        const auto* t = sqlite3_column_text(s, c);
        row.emplace_back(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
      out.push_back(std::move(row));
    }
    EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db_);
    sqlite3_finalize(s);
    return out;
  }
  std::string one(const std::string& sql) {
    auto r = rows(sql);
    return r.empty() || r[0].empty() ? "" : r[0][0];
  }

 private:
  sqlite3* db_ = nullptr;
};

MetricPoint point(std::string_view name, int64_t step, double value, int64_t seq) {
  return MetricPoint{name, step, value, 1000 + seq, seq};
}

// --- the store -------------------------------------------------------------------------------

TEST(TrackingStore, AppendsAndAnswersTheDashboardQueries) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  MetricsStore store(path);
  EXPECT_EQ(store.nextSeq(0), 0);
  std::vector<MetricPoint> r0{point("loss", 0, 2.5, 0), point("lr", 0, 0.1, 1),
                              point("loss", 1, 2.0, 2),
                              point("loss", 2, std::numeric_limits<double>::quiet_NaN(), 3)};
  std::vector<MetricPoint> r1{point("loss", 0, 3.5, 0), point("loss", 1, 3.0, 1)};
  store.append(0, r0);
  store.append(1, r1, /*newlyDropped=*/5);
  store.append(1, {}, /*newlyDropped=*/2);

  EXPECT_EQ(store.metricNames(), (std::vector<std::string>{"loss", "lr"}));
  EXPECT_EQ(store.nextSeq(0), 4);
  EXPECT_EQ(store.nextSeq(1), 2);
  EXPECT_EQ(store.nextSeq(7), 0);

  auto all = store.series("loss");
  ASSERT_EQ(all.size(), 5u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].id, all[i].id);
  EXPECT_EQ(all[0].rank, 0);
  EXPECT_EQ(all[0].value, 2.5);
  EXPECT_EQ(all[0].wallNs, 1000);
  EXPECT_TRUE(std::isnan(all[2].value)) << "NaN is stored (as NULL) and read back as NaN";
  EXPECT_EQ(all[3].rank, 1);

  auto rank1 = store.series("loss", {.rank = 1});
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[1].step, 1);
  EXPECT_EQ(rank1[1].value, 3.0);
  // Live polling: only what came after the last id seen.
  auto after = store.series("loss", {.afterId = all[2].id});
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].id, all[3].id);
  EXPECT_EQ(store.series("loss", {.fromStep = 1, .limit = 2}).size(), 2u);
  EXPECT_EQ(store.series("loss", {.fromStep = 2}).size(), 1u);
  EXPECT_TRUE(store.series("unknown").empty());

  auto latest = store.latest("loss");
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[0].rank, 0);
  EXPECT_EQ(latest[0].step, 2);
  EXPECT_EQ(latest[1].rank, 1);
  EXPECT_EQ(latest[1].value, 3.0);

  auto dropped = store.dropped();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].rank, 1);
  EXPECT_EQ(dropped[0].count, 7u);

  // A reader sees the same, and cannot write.
  MetricsStore reader(path, {.readOnly = true});
  EXPECT_EQ(reader.series("lr").size(), 1u);
  EXPECT_THROW(reader.append(0, r0), InvalidArgument);
  // A seq used twice by one rank is refused, and the whole batch with it.
  EXPECT_THROW(
      store.append(0, std::vector<MetricPoint>{point("lr", 9, 1, 4), point("lr", 9, 1, 3)}),
      StoreError);
  EXPECT_EQ(store.nextSeq(0), 4);
  EXPECT_THROW(store.append(0, std::vector<MetricPoint>{point("", 0, 1, 4)}), InvalidArgument);

  RawDb raw(path);
  EXPECT_EQ(raw.one("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.one("PRAGMA user_version"), std::to_string(kMetricsSchemaVersion));
  EXPECT_EQ(raw.one("SELECT count(*) FROM metric_values WHERE name = 'loss'"), "5");
}

TEST(TrackingStore, RefusesAFileThatIsNotADatabaseInOneLine) {
  TempDir dir;
  const std::string path = dir.path + "/notes.txt";
  const std::string text(8192, 'x');
  { std::ofstream(path) << text; }
  try {
    MetricsStore store(path);
    FAIL() << "opened a text file";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("not a Shoal metrics store"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_EQ(test::readFile(path), text) << "the file was modified";
}

TEST(TrackingStore, RefusesAnotherProgramsSqliteFileWithoutTouchingIt) {
  TempDir dir;
  const std::string path = dir.path + "/other.db";
  {
    RawDb raw(path);
    raw.exec("CREATE TABLE accounts(id INTEGER PRIMARY KEY, owner TEXT)");
  }
  try {
    MetricsStore store(path);
    FAIL() << "opened another program's database";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("not a Shoal metrics store"), std::string::npos) << what;
  }
  RawDb raw(path);
  EXPECT_EQ(raw.one("PRAGMA journal_mode"), "delete") << "switched to WAL before refusing";
  EXPECT_EQ(raw.one("SELECT count(*) FROM sqlite_master"), "1");
}

TEST(TrackingStore, RefusesANewerSchemaVersion) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  { MetricsStore store(path); }
  {
    RawDb raw(path);
    raw.exec("PRAGMA user_version = " + std::to_string(kMetricsSchemaVersion + 1));
  }
  for (bool readOnly : {false, true}) {
    try {
      MetricsStore store(path, {.readOnly = readOnly});
      FAIL() << "opened a newer schema";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find("newer"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(TrackingStore, ReaderNeedsAnExistingStore) {
  TempDir dir;
  EXPECT_THROW(MetricsStore(dir.path + "/missing.db", {.readOnly = true}), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/missing.db"));
}

// --- the tracker -----------------------------------------------------------------------------

TEST(TrackingTracker, FlushAndDestructorWriteEverythingInOrder) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  {
    Tracker tracker({.path = path, .rank = 3, .flushInterval = 1h});
    for (int step = 0; step < 100; ++step) {
      ASSERT_TRUE(tracker.log("loss", step, step * 0.5));
      ASSERT_TRUE(tracker.log("a_rather_long_metric_name/that_is_not_inline", step, -step));
    }
    tracker.flush(30s);
    EXPECT_EQ(tracker.written(), 200u);
    EXPECT_EQ(tracker.lastStep(), 99);
    MetricsStore reader(path, {.readOnly = true});
    ASSERT_EQ(reader.series("loss").size(), 100u);
    // Logged after the flush: written by the destructor (the interval is an hour).
    tracker.log("loss", 100, 50);
    EXPECT_THROW(tracker.log("", 0, 0), InvalidArgument);
  }
  RawDb raw(path);
  auto rows = raw.rows("SELECT seq, step FROM metric_values WHERE rank = 3 ORDER BY id");
  ASSERT_EQ(rows.size(), 201u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i][0], std::to_string(i));
  EXPECT_EQ(rows.back()[1], "100");

  // A second lifetime of the same rank continues the sequence.
  {
    Tracker again({.path = path, .rank = 3});
    again.log("loss", 101, 1);
  }
  EXPECT_EQ(raw.one("SELECT max(seq) FROM metrics WHERE rank = 3"), "201");
}

TEST(TrackingTracker, FlushThrowsAtItsDeadlineWhileTheFileIsLocked) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  Tracker tracker({.path = path, .rank = 0, .flushInterval = 1h});
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");  // another process's long write transaction
  tracker.log("loss", 0, 1);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    tracker.flush(200ms);
    FAIL() << "flush returned with the file locked";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("1 of 1 points"), std::string::npos) << what;
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 10.0);
  // The writer is still waiting for the lock (within its busy timeout): once released, it lands.
  holder.exec("COMMIT");
  tracker.flush(30s);
  EXPECT_EQ(tracker.written(), 1u);
}

TEST(TrackingTracker, AFullBufferDropsAndCountsNeverSilently) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  Tracker tracker({.path = path, .rank = 2, .flushInterval = 1h, .maxQueued = 8});
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");  // the writer cannot drain the buffer
  int accepted = 0;
  int refused = 0;
  for (int step = 0; step < 100; ++step) (tracker.log("loss", step, step) ? accepted : refused)++;
  // At most one batch in the writer's hands and a full buffer: the rest was dropped.
  EXPECT_LE(accepted, 16);
  EXPECT_EQ(static_cast<uint64_t>(refused), tracker.dropped());
  EXPECT_EQ(static_cast<uint64_t>(accepted), tracker.logged());
  holder.exec("COMMIT");
  tracker.flush(30s);

  MetricsStore reader(path, {.readOnly = true});
  auto rows = reader.series("loss");
  ASSERT_EQ(rows.size(), static_cast<size_t>(accepted));
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].seq, static_cast<int64_t>(i));
  auto dropped = reader.dropped();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].rank, 2);
  EXPECT_EQ(dropped[0].count, static_cast<uint64_t>(refused));
  EXPECT_EQ(rows.size() + dropped[0].count, 100u) << "every point is stored or counted";
}

TEST(TrackingTracker, AWriterFailureIsReportedByFlushAndLog) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  Tracker tracker({.path = path, .rank = 0, .flushInterval = 1h, .storeBusyTimeout = 100ms});
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");
  tracker.log("loss", 0, 1);
  try {
    tracker.flush(30s);
    FAIL() << "flush succeeded with the file locked past the busy timeout";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("locked by another process"), std::string::npos)
        << "the writer's own error, not flush's deadline: " << what;
  }
  holder.exec("COMMIT");
  EXPECT_THROW(tracker.log("loss", 1, 1), TimeoutError) << "the error is kept";
  EXPECT_THROW(tracker.flush(1s), TimeoutError);
}

// --- the system sampler ----------------------------------------------------------------------

TEST(TrackingSampler, SamplesPlausibleValuesAndStopsPromptly) {
  const ProcessStats stats = readProcessStats();
  EXPECT_GT(stats.rssBytes, 1u << 20);
  EXPECT_GE(stats.cpuSeconds, 0.0);

  TempDir dir;
  const std::string path = dir.path + "/metrics.db";
  Tracker tracker({.path = path, .rank = 1, .flushInterval = 1h});
  tracker.log("loss", 42, 1.0);
  {
    std::optional<SystemSampler> sampler(std::in_place, tracker, SystemSamplerOptions{20ms});
    std::atomic<bool> stop{false};
    std::thread burner([&] {  // CPU time for the sampler to see
      volatile uint64_t x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 3 + 1;
    });
    const bool sampled = sampler->waitForSamples(3, 30s);
    stop = true;
    burner.join();
    ASSERT_TRUE(sampled);
    const auto t0 = std::chrono::steady_clock::now();
    sampler.reset();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  // An hour's interval: the destructor must not wait it out.
  const auto t0 = std::chrono::steady_clock::now();
  { SystemSampler idle(tracker, {.interval = 1h}); }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);

  tracker.flush(30s);
  MetricsStore reader(path, {.readOnly = true});
  auto rss = reader.series("sys/rss_bytes");
  auto cpu = reader.series("sys/cpu_percent");
  ASSERT_GE(rss.size(), 3u);
  ASSERT_EQ(cpu.size(), rss.size());
  double maxCpu = 0;
  for (size_t i = 0; i < rss.size(); ++i) {
    EXPECT_GT(rss[i].value, double(1u << 20));
    EXPECT_EQ(rss[i].step, 42) << "samples carry the tracker's last step";
    EXPECT_GE(cpu[i].value, 0.0);
    EXPECT_LE(cpu[i].value, 100.0 * std::thread::hardware_concurrency() + 50);
    maxCpu = std::max(maxCpu, cpu[i].value);
  }
  EXPECT_GT(maxCpu, 0.0) << "a busy thread ran while sampling";
}

// --- real processes --------------------------------------------------------------------------

constexpr const char* kTrainingMetrics[] = {"loss", "accuracy", "lr", "samples_per_s"};

double workerValue(int rank, int64_t step, int metric) {
  return rank * 1e7 + static_cast<double>(step) * 8 + metric + 0.25;
}

std::vector<std::string> workerArgs(const std::string& db, int rank, int64_t steps) {
  return {SHOAL_TRACKING_WORKER,
          "--db",
          db,
          "--rank",
          std::to_string(rank),
          "--steps",
          std::to_string(steps),
          "--metrics",
          "4",
          "--work",
          "2000",
          "--flush-ms",
          "5",
          "--sampler-ms",
          "10"};
}

// The rank's points in the file: seq 0, 1, 2, ... with no gap, and every training metric's
// steps 0..count-1 in order with exact values. Returns the number of training steps found.
int64_t checkRank(RawDb& raw, int rank) {
  auto rows = raw.rows("SELECT seq, name, step, value FROM metric_values WHERE rank = " +
                       std::to_string(rank) + " ORDER BY seq");
  std::map<std::string, int64_t> nextStep;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][0], std::to_string(i)) << "rank " << rank << ": a gap in seq";
    if (rows[i][0] != std::to_string(i)) return -1;
  }
  // Insertion order agrees with seq order.
  auto byId =
      raw.rows("SELECT seq FROM metrics WHERE rank = " + std::to_string(rank) + " ORDER BY id");
  for (size_t i = 0; i < byId.size(); ++i) EXPECT_EQ(byId[i][0], std::to_string(i));
  for (const auto& row : rows) {
    const std::string& name = row[1];
    if (name.rfind("sys/", 0) == 0) continue;
    int metric = -1;
    for (int m = 0; m < 4; ++m) metric = name == kTrainingMetrics[m] ? m : metric;
    EXPECT_GE(metric, 0) << name;
    const int64_t step = std::stoll(row[2]);
    EXPECT_EQ(step, nextStep[name]) << "rank " << rank << " " << name;
    nextStep[name] = step + 1;
    EXPECT_EQ(std::stod(row[3]), workerValue(rank, step, metric)) << "rank " << rank << " " << name;
  }
  int64_t steps = -1;
  for (const char* m : kTrainingMetrics) {
    // A killed rank may stop between two metrics of one step: at most one step apart.
    const int64_t n = nextStep[m];
    steps = steps < 0 ? n : std::min(steps, n);
    EXPECT_LE(n - steps, 1) << "rank " << rank << " " << m;
  }
  return steps;
}

TEST(TrackingProcesses, FourRanksWriteOneStoreNoneLostAllInOrder) {
  TempDir dir;
  const std::string db = dir.path + "/metrics.db";
  constexpr int64_t kSteps = 2000;
  std::vector<std::unique_ptr<Proc>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<Proc>(workerArgs(db, r, kSteps),
                                           dir.path + "/rank" + std::to_string(r) + ".out"));
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r]->wait(120s), 0) << "rank " << r << ": " << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("done"), std::string::npos) << ranks[r]->output();
  }

  RawDb raw(db);
  EXPECT_EQ(raw.one("PRAGMA integrity_check"), "ok");
  for (int r = 0; r < 4; ++r) EXPECT_EQ(checkRank(raw, r), kSteps) << "rank " << r;

  MetricsStore reader(db, {.readOnly = true});
  auto names = reader.metricNames();
  for (const char* m : kTrainingMetrics) {
    EXPECT_NE(std::find(names.begin(), names.end(), m), names.end()) << m;
  }
  auto latest = reader.latest("loss");
  ASSERT_EQ(latest.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(latest[r].rank, r);
    EXPECT_EQ(latest[r].step, kSteps - 1);
    EXPECT_EQ(latest[r].value, workerValue(r, kSteps - 1, 0));
  }
  auto rss = reader.latest("sys/rss_bytes");
  ASSERT_EQ(rss.size(), 4u) << "every rank sampled its memory";
  for (const auto& row : rss) EXPECT_GT(row.value, double(1u << 20));
  EXPECT_TRUE(reader.dropped().empty());

  // Polling as a dashboard does (pages of 1000 after the last id seen) reads the same series.
  std::vector<MetricRow> polled;
  for (;;) {
    auto page = reader.series("accuracy",
                              {.afterId = polled.empty() ? 0 : polled.back().id, .limit = 1000});
    if (page.empty()) break;
    polled.insert(polled.end(), page.begin(), page.end());
  }
  EXPECT_EQ(polled.size(), 4u * kSteps);
}

TEST(TrackingProcesses, AKilledRankLeavesAReadableStoreWithEverythingItFlushed) {
  TempDir dir;
  const std::string db = dir.path + "/metrics.db";
  constexpr int64_t kSteps = 2000;
  constexpr int64_t kFlushedSteps = 500;
  std::vector<std::unique_ptr<Proc>> ranks;
  for (int r = 0; r < 4; ++r) {
    auto args = workerArgs(db, r, kSteps);
    if (r == 2) {
      args.push_back("--kill-after");
      args.push_back(std::to_string(kFlushedSteps));
    }
    ranks.push_back(std::make_unique<Proc>(args, dir.path + "/rank" + std::to_string(r) + ".out"));
  }
  for (int r = 0; r < 4; ++r) {
    const int code = ranks[r]->wait(120s);
    EXPECT_EQ(code, r == 2 ? 128 + SIGKILL : 0) << "rank " << r << ": " << ranks[r]->output();
  }
  const std::string out = ranks[2]->output();
  const size_t at = out.find("flushed ");
  ASSERT_NE(at, std::string::npos) << out;
  const int64_t flushedPoints = std::stoll(out.substr(at + 8));
  EXPECT_GE(flushedPoints, kFlushedSteps * 4);

  // The store opens as it is, checks out, and the survivors' points are all there.
  MetricsStore reader(db, {.readOnly = true});
  RawDb raw(db);
  EXPECT_EQ(raw.one("PRAGMA integrity_check"), "ok");
  for (int r : {0, 1, 3}) EXPECT_EQ(checkRank(raw, r), kSteps) << "rank " << r;
  // The killed rank: a gap-free prefix holding at least what it flushed, and not what it never
  // reached.
  const int64_t steps = checkRank(raw, 2);
  EXPECT_GE(steps, kFlushedSteps);
  EXPECT_LT(steps, kSteps);
  EXPECT_GE(std::stoll(raw.one("SELECT count(*) FROM metrics WHERE rank = 2")), flushedPoints);
  // A writer can open the store after the crash and go on.
  MetricsStore writer(db);
  EXPECT_GE(writer.nextSeq(2), flushedPoints);
}

}  // namespace
}  // namespace shoal::track
