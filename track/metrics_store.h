// A job's metrics in one SQLite file (Debian's libsqlite3): every rank appends, the dashboard
// reads. Tracker (track/tracker.h) is the writer ranks use; this class is the file itself.
//
// Schema (version kMetricsSchemaVersion in PRAGMA user_version; PRAGMA application_id is
// kMetricsApplicationId, which is how a Shoal metrics file is told from any other SQLite file):
//   names(id INTEGER PRIMARY KEY, name TEXT UNIQUE)
//   metrics(id INTEGER PRIMARY KEY, rank, seq, name_id, step, value REAL NULL, wall_ns)
//     id grows with every commit (writers are serialized by SQLite's write lock), so a reader
//     polls with "id > the last id I saw". seq numbers one rank's points 0, 1, 2, ... across all
//     of its metrics (UNIQUE(rank, seq)): a gap is a lost point. value NULL stands for NaN
//     (SQLite cannot store NaN). wall_ns: the system clock (ns since the epoch) at log().
//   latest(name_id, rank, metric_id): each rank's newest point of each metric.
//   dropped(rank, count, wall_ns): points a rank's Tracker discarded because its buffer was
//     full, summed over its lifetimes; wall_ns is the last time the count grew.
//   metric_values: a view of metrics joined with names, for people using the sqlite3 shell.
//
// Concurrency: many processes may hold the file open at once (4 to 8 ranks writing, a dashboard
// reading). The file is in WAL mode with synchronous=NORMAL: readers never block writers, a
// commit costs no fsync, and a process that dies (SIGKILL included) loses only what it had not
// committed; the file stays consistent. Writers take the write lock in turn; a writer waits for
// it at most MetricsStoreOptions::busyTimeout, then the call throws TimeoutError.
//
// Threading: one MetricsStore is one SQLite connection; it is not thread-safe (one thread at a
// time, any thread). Every call blocks on file I/O and may wait for the write lock as above.
//
// Errors: every failure is one line naming the file and the operation. InvalidArgument when the
// file is not a Shoal metrics store (not SQLite, another program's SQLite file, or a newer
// schema version); such a file is never modified. TimeoutError when the lock did not come in
// time; StoreError for any other SQLite failure (I/O error, disk full, a corrupt file).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

struct sqlite3;
struct sqlite3_stmt;

namespace shoal::track {

inline constexpr int kMetricsSchemaVersion = 1;
inline constexpr int32_t kMetricsApplicationId = 0x53686f6c;  // "Shol"
// Longest metric name accepted (bytes): names are labels, not payloads.
inline constexpr size_t kMaxMetricNameBytes = 256;

// One point to append. `name` must stay valid for the duration of append().
struct MetricPoint {
  std::string_view name;
  int64_t step = 0;
  double value = 0;
  int64_t wallNs = 0;
  int64_t seq = 0;
};

// One point as read back.
struct MetricRow {
  int64_t id = 0;
  int rank = 0;
  int64_t seq = 0;
  std::string name;
  int64_t step = 0;
  double value = 0;  // NaN where NaN was logged
  int64_t wallNs = 0;
};

struct SeriesQuery {
  std::optional<int> rank;  // only this rank's points; all ranks when empty
  int64_t afterId = 0;      // only points with id > afterId (live polling)
  int64_t fromStep = INT64_MIN;
  size_t limit = 0;  // at most this many (the oldest first); 0: no limit
};

struct DroppedPoints {
  int rank = 0;
  uint64_t count = 0;
  int64_t wallNs = 0;
};

struct MetricsStoreOptions {
  // Open for reading only: the file must already be a metrics store; nothing is written.
  bool readOnly = false;
  // The longest a call waits for another process's lock before TimeoutError.
  std::chrono::milliseconds busyTimeout{30000};
};

class MetricsStore {
 public:
  // Opens `path`, creating the file and its schema if it does not exist or is empty (several
  // processes may do this at once: one creates, the others find it made). Blocking; throws as
  // the file comment says.
  explicit MetricsStore(std::string path, MetricsStoreOptions options = {});
  ~MetricsStore();
  MetricsStore(const MetricsStore&) = delete;
  MetricsStore& operator=(const MetricsStore&) = delete;

  const std::string& path() const { return path_; }

  // Appends `points` of `rank` and adds `newlyDropped` to the rank's dropped count, all in one
  // transaction: all of it is in the file afterwards, or none of it (and the call throws).
  // InvalidArgument for an empty or overlong name (nothing written).
  void append(int rank, std::span<const MetricPoint> points, uint64_t newlyDropped = 0);

  // The seq the rank's next point should carry: one past the largest in the file, 0 if none.
  int64_t nextSeq(int rank);

  // Read queries (the dashboard's). Each is one consistent snapshot of the file.
  std::vector<std::string> metricNames();
  // Points of one metric, ordered by id (commit order; for one rank also seq order). Empty for
  // a name never logged.
  std::vector<MetricRow> series(std::string_view name, const SeriesQuery& query = {});
  // The newest point of `name` of each rank that logged it, by rank.
  std::vector<MetricRow> latest(std::string_view name);
  // The ranks that dropped points, by rank.
  std::vector<DroppedPoints> dropped();

 private:
  struct StatementDeleter {
    void operator()(sqlite3_stmt* s) const;
  };
  using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

  [[noreturn]] void fail(std::string_view operation, int rc) const;
  void close() noexcept;
  void exec(const char* sql, std::string_view operation);
  Statement prepare(const char* sql, std::string_view operation);
  void checkFormat();
  void createSchema();
  int64_t nameId(std::string_view name);
  std::vector<MetricRow> readRows(sqlite3_stmt* stmt, std::string_view operation);

  std::string path_;
  MetricsStoreOptions options_;
  sqlite3* db_ = nullptr;
  // Name ids known to be committed in the file (cleared when a transaction rolls back, since
  // ids made inside it vanish with it).
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int64_t, NameHash, std::equal_to<>> nameIds_;
  Statement insertPoint_, insertName_, selectName_, upsertLatest_, addDropped_;
};

}  // namespace shoal::track
