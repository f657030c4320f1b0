#include "track/metrics_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/error.h"

namespace shoal::track {

namespace {

// The schema of version 1, created in one transaction with the two pragmas that mark the file
// as ours, so another process never sees half of it.
const char* const kSchema = R"sql(
CREATE TABLE names(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE metrics(
  id INTEGER PRIMARY KEY,
  rank INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  name_id INTEGER NOT NULL REFERENCES names(id),
  step INTEGER NOT NULL,
  value REAL,
  wall_ns INTEGER NOT NULL);
CREATE UNIQUE INDEX metrics_by_rank ON metrics(rank, seq);
CREATE INDEX metrics_by_name ON metrics(name_id, id);
CREATE TABLE latest(
  name_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  metric_id INTEGER NOT NULL,
  PRIMARY KEY(name_id, rank)) WITHOUT ROWID;
CREATE TABLE dropped(rank INTEGER PRIMARY KEY, count INTEGER NOT NULL, wall_ns INTEGER NOT NULL);
CREATE VIEW metric_values AS
  SELECT m.id, m.rank, m.seq, n.name, m.step, m.value, m.wall_ns
  FROM metrics m JOIN names n ON n.id = m.name_id;
)sql";

const char* const kRowColumns =
    "SELECT m.id, m.rank, m.seq, n.name, m.step, m.value, m.wall_ns FROM metrics m "
    "JOIN names n ON n.id = m.name_id ";

}  // namespace

void MetricsStore::StatementDeleter::operator()(sqlite3_stmt* s) const {
  sqlite3_finalize(s);
}

MetricsStore::MetricsStore(std::string path, MetricsStoreOptions options)
    : path_(std::move(path)), options_(options) {
  if (options_.readOnly && !std::filesystem::exists(path_)) {
    SHOAL_THROW(InvalidArgument, "metrics store {}: open: no such file", path_);
  }
  const int flags =
      options_.readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    // The handle exists even on failure (unless out of memory) and holds the message.
    std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    const int err = db_ != nullptr ? sqlite3_system_errno(db_) : 0;
    sqlite3_close_v2(db_);
    db_ = nullptr;
    SHOAL_THROW(StoreError, "metrics store {}: open: {}{}{}", path_, message, err != 0 ? ": " : "",
                err != 0 ? std::strerror(err) : "");
  }
  try {
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, static_cast<int>(options_.busyTimeout.count()));
    // Validated before anything is written: a file that is not ours is left as it was.
    checkFormat();
    if (!options_.readOnly) {
      createSchema();
      // Prepared once: the writer appends every flush interval for the whole job.
      insertPoint_ = prepare(
          "INSERT INTO metrics(rank, seq, name_id, step, value, wall_ns) VALUES(?,?,?,?,?,?)",
          "prepare insert");
      insertName_ = prepare("INSERT OR IGNORE INTO names(name) VALUES(?)", "prepare insert");
      selectName_ = prepare("SELECT id FROM names WHERE name = ?", "prepare insert");
      upsertLatest_ = prepare(
          "INSERT INTO latest(name_id, rank, metric_id) VALUES(?,?,?) "
          "ON CONFLICT(name_id, rank) DO UPDATE SET metric_id = excluded.metric_id",
          "prepare insert");
      addDropped_ = prepare(
          "INSERT INTO dropped(rank, count, wall_ns) VALUES(?,?,?) "
          "ON CONFLICT(rank) DO UPDATE SET count = count + excluded.count, "
          "wall_ns = excluded.wall_ns",
          "prepare insert");
    }
  } catch (...) {
    close();
    throw;
  }
}

MetricsStore::~MetricsStore() {
  close();
}

void MetricsStore::close() noexcept {
  // Statements first: a connection with statements left open is not closed.
  insertPoint_.reset();
  insertName_.reset();
  selectName_.reset();
  upsertLatest_.reset();
  addDropped_.reset();
  sqlite3_close_v2(db_);
}

void MetricsStore::fail(std::string_view operation, int rc) const {
  const char* message = sqlite3_errmsg(db_);
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
      SHOAL_THROW(InvalidArgument, "metrics store {}: {}: not a Shoal metrics store ({})", path_,
                  operation, message);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      SHOAL_THROW(TimeoutError,
                  "metrics store {}: {}: still locked by another process after {:.1f} s ({})",
                  path_, operation, options_.busyTimeout.count() / 1000.0, message);
    default: {
      const int err = sqlite3_system_errno(db_);
      SHOAL_THROW(StoreError, "metrics store {}: {}: {} (SQLite error {}{}{})", path_, operation,
                  message, rc, err != 0 ? ", " : "", err != 0 ? std::strerror(err) : "");
    }
  }
}

void MetricsStore::exec(const char* sql, std::string_view operation) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail(operation, rc);
}

MetricsStore::Statement MetricsStore::prepare(const char* sql, std::string_view operation) {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) fail(operation, rc);
  return Statement(stmt);
}

namespace {

// One integer from a one-row query (a pragma or a count). rc: SQLite's code on failure.
int64_t queryInt(sqlite3* db, const char* sql, int* rc) {
  sqlite3_stmt* stmt = nullptr;
  *rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (*rc != SQLITE_OK) return 0;
  int64_t value = 0;
  *rc = sqlite3_step(stmt);
  if (*rc == SQLITE_ROW) {
    value = sqlite3_column_int64(stmt, 0);
    *rc = SQLITE_OK;
  } else if (*rc == SQLITE_DONE) {
    *rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  return value;
}

}  // namespace

void MetricsStore::checkFormat() {
  // Read in one transaction so that the three answers describe the same state of the file.
  exec("BEGIN", "check format");
  int rc = SQLITE_OK;
  const int64_t appId = queryInt(db_, "PRAGMA application_id", &rc);
  int64_t version = 0;
  int64_t objects = 0;
  if (rc == SQLITE_OK) version = queryInt(db_, "PRAGMA user_version", &rc);
  if (rc == SQLITE_OK) objects = queryInt(db_, "SELECT count(*) FROM sqlite_master", &rc);
  sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail("check format", rc);

  if (appId == 0 && objects == 0) {
    // Empty (new, or being created by another process right now): createSchema() decides under
    // the write lock. A reader has nothing to read yet.
    if (options_.readOnly) {
      SHOAL_THROW(InvalidArgument, "metrics store {}: open: empty, no metrics written yet", path_);
    }
    return;
  }
  if (appId != kMetricsApplicationId) {
    SHOAL_THROW(InvalidArgument,
                "metrics store {}: open: not a Shoal metrics store (an SQLite file with "
                "application id {:#x} and {} schema objects)",
                path_, appId, objects);
  }
  if (version > kMetricsSchemaVersion) {
    SHOAL_THROW(InvalidArgument,
                "metrics store {}: open: schema version {} was written by a newer Shoal (this "
                "one reads version {})",
                path_, version, kMetricsSchemaVersion);
  }
  if (version < 1) {
    SHOAL_THROW(InvalidArgument, "metrics store {}: open: unknown schema version {}", path_,
                version);
  }
}

void MetricsStore::createSchema() {
  // WAL before the schema, so even the first transaction is written the crash-safe way. The
  // journal mode is a property of the file; synchronous is one of this connection.
  //
  // The switch needs the file's exclusive lock. When several processes open a new store at once,
  // SQLite answers one of them SQLITE_BUSY at once, without its busy handler (waiting could
  // deadlock two connections that both hold a shared lock), so the wait is here: tried again
  // with a growing pause (1 to 50 ms: the lock belongs to another process, there is no event to
  // wait on) until the busy timeout.
  const auto deadline = std::chrono::steady_clock::now() + options_.busyTimeout;
  int pauseMs = 1;
  Statement mode(nullptr);
  int rc = SQLITE_OK;
  while (true) {
    sqlite3_stmt* raw = nullptr;
    rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, &raw, nullptr);
    mode = Statement(raw);
    if (rc == SQLITE_OK) rc = sqlite3_step(mode.get());
    if (rc == SQLITE_ROW) break;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) {
      fail("set WAL journal mode", rc);
    }
    mode.reset();
    sqlite3_sleep(pauseMs);
    pauseMs = std::min(pauseMs * 2, 50);
  }
  const char* got = reinterpret_cast<const char*>(sqlite3_column_text(mode.get(), 0));
  if (got == nullptr || std::strcmp(got, "wal") != 0) {
    SHOAL_THROW(StoreError,
                "metrics store {}: set WAL journal mode: the file stays in mode '{}' (WAL needs a "
                "local filesystem with shared memory)",
                path_, got == nullptr ? "" : got);
  }
  mode.reset();
  exec("PRAGMA synchronous=NORMAL", "set synchronous mode");

  // IMMEDIATE: the write lock first, then the check, so exactly one process creates the schema.
  exec("BEGIN IMMEDIATE", "create schema");
  try {
    const int64_t appId = queryInt(db_, "PRAGMA application_id", &rc);
    if (rc != SQLITE_OK) fail("create schema", rc);
    if (appId == 0) {
      exec(kSchema, "create schema");
      exec(fmt::format("PRAGMA application_id={}; PRAGMA user_version={}", kMetricsApplicationId,
                       kMetricsSchemaVersion)
               .c_str(),
           "create schema");
    }
    exec("COMMIT", "create schema");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

int64_t MetricsStore::nameId(std::string_view name) {
  auto it = nameIds_.find(name);
  if (it != nameIds_.end()) return it->second;
  // Another process may have added the name already: insert if missing, then read its id.
  sqlite3_bind_text(insertName_.get(), 1, name.data(), static_cast<int>(name.size()),
                    SQLITE_STATIC);
  int rc = sqlite3_step(insertName_.get());
  sqlite3_reset(insertName_.get());
  if (rc != SQLITE_DONE) fail("append (metric name)", rc);
  sqlite3_bind_text(selectName_.get(), 1, name.data(), static_cast<int>(name.size()),
                    SQLITE_STATIC);
  rc = sqlite3_step(selectName_.get());
  if (rc != SQLITE_ROW) {
    sqlite3_reset(selectName_.get());
    fail("append (metric name)", rc);
  }
  const int64_t id = sqlite3_column_int64(selectName_.get(), 0);
  sqlite3_reset(selectName_.get());
  nameIds_.emplace(std::string(name), id);
  return id;
}

void MetricsStore::append(int rank, std::span<const MetricPoint> points, uint64_t newlyDropped) {
  if (options_.readOnly) {
    SHOAL_THROW(InvalidArgument, "metrics store {}: append: opened read-only", path_);
  }
  for (const MetricPoint& p : points) {
    if (p.name.empty() || p.name.size() > kMaxMetricNameBytes) {
      SHOAL_THROW(InvalidArgument,
                  "metrics store {}: append: metric name of {} bytes (1 to {} allowed)", path_,
                  p.name.size(), kMaxMetricNameBytes);
    }
  }
  if (points.empty() && newlyDropped == 0) return;

  exec("BEGIN IMMEDIATE", "append (begin)");
  try {
    // The newest point of each metric in this batch, for `latest`: a handful of names per batch.
    std::vector<std::pair<int64_t, int64_t>> newest;  // name id, metric id
    for (const MetricPoint& p : points) {
      const int64_t name = nameId(p.name);
      sqlite3_stmt* s = insertPoint_.get();
      sqlite3_bind_int(s, 1, rank);
      sqlite3_bind_int64(s, 2, p.seq);
      sqlite3_bind_int64(s, 3, name);
      sqlite3_bind_int64(s, 4, p.step);
      if (std::isnan(p.value)) {
        sqlite3_bind_null(s, 5);
      } else {
        sqlite3_bind_double(s, 5, p.value);
      }
      sqlite3_bind_int64(s, 6, p.wallNs);
      const int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc != SQLITE_DONE) fail(fmt::format("append (rank {} seq {})", rank, p.seq), rc);
      const int64_t id = sqlite3_last_insert_rowid(db_);
      bool found = false;
      for (auto& [n, m] : newest) {
        if (n == name) {
          m = id;
          found = true;
          break;
        }
      }
      if (!found) newest.emplace_back(name, id);
    }
    for (const auto& [name, id] : newest) {
      sqlite3_stmt* s = upsertLatest_.get();
      sqlite3_bind_int64(s, 1, name);
      sqlite3_bind_int(s, 2, rank);
      sqlite3_bind_int64(s, 3, id);
      const int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc != SQLITE_DONE) fail("append (latest)", rc);
    }
    if (newlyDropped > 0) {
      sqlite3_stmt* s = addDropped_.get();
      sqlite3_bind_int(s, 1, rank);
      sqlite3_bind_int64(s, 2, static_cast<int64_t>(newlyDropped));
      sqlite3_bind_int64(s, 3,
                         std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count());
      const int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc != SQLITE_DONE) fail("append (dropped count)", rc);
    }
    exec("COMMIT", "append (commit)");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    // Ids of names first inserted in this transaction are gone with it (another process may
    // reuse them for other names): forget them all, they are read again cheaply.
    nameIds_.clear();
    throw;
  }
}

int64_t MetricsStore::nextSeq(int rank) {
  Statement s = prepare("SELECT max(seq) FROM metrics WHERE rank = ?", "read next seq");
  sqlite3_bind_int(s.get(), 1, rank);
  const int rc = sqlite3_step(s.get());
  if (rc != SQLITE_ROW) fail("read next seq", rc);
  if (sqlite3_column_type(s.get(), 0) == SQLITE_NULL) return 0;
  return sqlite3_column_int64(s.get(), 0) + 1;
}

std::vector<std::string> MetricsStore::metricNames() {
  Statement s = prepare("SELECT name FROM names ORDER BY name", "list metric names");
  std::vector<std::string> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0)),
                     static_cast<size_t>(sqlite3_column_bytes(s.get(), 0)));
  }
  if (rc != SQLITE_DONE) fail("list metric names", rc);
  return out;
}

std::vector<MetricRow> MetricsStore::readRows(sqlite3_stmt* stmt, std::string_view operation) {
  std::vector<MetricRow> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    MetricRow r;
    r.id = sqlite3_column_int64(stmt, 0);
    r.rank = sqlite3_column_int(stmt, 1);
    r.seq = sqlite3_column_int64(stmt, 2);
    r.name.assign(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 3)),
                  static_cast<size_t>(sqlite3_column_bytes(stmt, 3)));
    r.step = sqlite3_column_int64(stmt, 4);
    r.value = sqlite3_column_type(stmt, 5) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                          : sqlite3_column_double(stmt, 5);
    r.wallNs = sqlite3_column_int64(stmt, 6);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) fail(operation, rc);
  return out;
}

std::vector<MetricRow> MetricsStore::series(std::string_view name, const SeriesQuery& query) {
  const std::string sql =
      std::string(kRowColumns) +
      "WHERE m.name_id = (SELECT id FROM names WHERE name = ?1) AND m.id > ?2 AND m.step >= ?3" +
      (query.rank ? " AND m.rank = ?4" : "") + " ORDER BY m.id" + (query.limit ? " LIMIT ?5" : "");
  const std::string operation = fmt::format("read series '{}'", name);
  Statement s = prepare(sql.c_str(), operation);
  sqlite3_bind_text(s.get(), 1, name.data(), static_cast<int>(name.size()), SQLITE_STATIC);
  sqlite3_bind_int64(s.get(), 2, query.afterId);
  sqlite3_bind_int64(s.get(), 3, query.fromStep);
  if (query.rank) sqlite3_bind_int(s.get(), 4, *query.rank);
  if (query.limit) sqlite3_bind_int64(s.get(), 5, static_cast<int64_t>(query.limit));
  return readRows(s.get(), operation);
}

std::vector<MetricRow> MetricsStore::latest(std::string_view name) {
  const std::string sql =
      std::string(kRowColumns) +
      "JOIN latest l ON l.metric_id = m.id "
      "WHERE l.name_id = (SELECT id FROM names WHERE name = ?1) ORDER BY m.rank";
  const std::string operation = fmt::format("read latest '{}'", name);
  Statement s = prepare(sql.c_str(), operation);
  sqlite3_bind_text(s.get(), 1, name.data(), static_cast<int>(name.size()), SQLITE_STATIC);
  return readRows(s.get(), operation);
}

std::vector<DroppedPoints> MetricsStore::dropped() {
  Statement s =
      prepare("SELECT rank, count, wall_ns FROM dropped ORDER BY rank", "read dropped counts");
  std::vector<DroppedPoints> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    out.push_back({sqlite3_column_int(s.get(), 0),
                   static_cast<uint64_t>(sqlite3_column_int64(s.get(), 1)),
                   sqlite3_column_int64(s.get(), 2)});
  }
  if (rc != SQLITE_DONE) fail("read dropped counts", rc);
  return out;
}

}  // namespace shoal::track
