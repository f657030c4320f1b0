// Experiment tracking for one process: log(name, step, value) from the training loop, written to
// the job's metrics store (track/metrics_store.h) by a background thread.
//
//   track::Tracker tracker({.path = runDir + "/metrics.db", .rank = rank});
//   tracker.log("loss", step, loss);          // cheap: no I/O, never waits for the file
//   tracker.flush();                          // optional: everything so far is in the file
//
// What log() costs: one read of the system clock, one short mutex, a hash lookup of the name
// and a copy of 40 bytes into a buffer; memory is allocated only the first time a name is seen
// (names are interned for the Tracker's lifetime) and when the buffer grows to its high-water
// mark. Never file I/O, never a wait for the writer beyond that mutex (which the writer holds
// only to swap buffers).
//
// The writer: a thread that wakes every flushInterval, when half of maxQueued points are waiting,
// or on flush(), and appends everything waiting in one transaction. Points of one Tracker reach
// the file in log() order, each with the next per-rank seq (continuing after the largest seq the
// file already has for this rank, so a restarted rank does not reuse numbers).
//
// A full buffer (maxQueued points waiting, because the file is slow or locked): log() drops the
// point and returns false. Nothing is lost silently: the number dropped goes into the store's
// `dropped` table with the next batch, and the first drop is logged as a warning once.
//
// Errors: the constructor throws what MetricsStore's constructor throws (the file is opened and
// checked there, on the caller's thread). A failure of the writer (disk full, file removed, the
// lock not obtained within storeBusyTimeout) is kept: from then on log() and flush() throw it and
// the writer stops. The Tracker does not retry: a store that failed this way needs attention.
//
// Threading: log(), flush() and the counters are thread-safe. Ownership: the Tracker owns its
// thread and its store connection. The destructor writes what is waiting (bounded by
// storeBusyTimeout per transaction), logs a warning if it could not, and never throws. A process
// killed without unwinding loses the points not yet written; the file stays readable.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "track/metrics_store.h"

namespace shoal::track {

struct TrackerOptions {
  std::string path;  // the store file, e.g. RUN_DIR/metrics.db; created if missing
  int rank = 0;
  // The longest a point waits in memory before the writer appends it.
  std::chrono::milliseconds flushInterval{1000};
  // Points waiting at most; beyond, log() drops (and counts) them. At least 1.
  size_t maxQueued = size_t{1} << 16;
  // flush() without an argument waits at most this long.
  std::chrono::milliseconds flushTimeout{30000};
  // One transaction waits at most this long for other processes' write lock.
  std::chrono::milliseconds storeBusyTimeout{30000};
};

class Tracker {
 public:
  // Opens (or creates) the store and starts the writer. InvalidArgument for bad options or a
  // file that is not a metrics store; StoreError / TimeoutError if it cannot be opened.
  explicit Tracker(TrackerOptions options);
  // Writes what is waiting, then stops the writer. Never throws.
  ~Tracker();
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  // Queues one point. Returns false if the buffer was full and the point was dropped (and
  // counted). InvalidArgument for an empty name or one over kMaxMetricNameBytes; rethrows the
  // writer's error if it failed. Non-blocking apart from a short mutex; thread-safe.
  bool log(std::string_view name, int64_t step, double value);

  // Blocks until every point logged (or dropped) before the call is in the file, or the
  // deadline: TimeoutError naming the file and how many points are still waiting. Rethrows the
  // writer's error. Thread-safe.
  void flush();
  void flush(std::chrono::milliseconds timeout);

  // Points accepted, written to the file, and dropped so far.
  uint64_t logged() const;
  uint64_t written() const;
  uint64_t dropped() const;
  // The step of the newest point logged (-1 before any): what SystemSampler labels its samples
  // with, so system metrics line up with training steps.
  int64_t lastStep() const { return lastStep_.load(std::memory_order_relaxed); }

  int rank() const { return options_.rank; }
  const std::string& path() const { return options_.path; }

 private:
  void writerLoop();
  void rethrowIfFailed() const;

  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  const TrackerOptions options_;
  const size_t wakeAt_;                  // queue length at which log() wakes the writer early
  std::unique_ptr<MetricsStore> store_;  // used by the writer thread only, once it runs

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the writer waits here
  std::condition_variable done_;  // flush() waits here
  // Interned names: set nodes never move, so points hold views of them until written.
  std::unordered_set<std::string, NameHash, std::equal_to<>> names_;
  std::vector<MetricPoint> queue_;
  int64_t nextSeq_ = 0;
  uint64_t logged_ = 0;
  uint64_t written_ = 0;
  uint64_t dropped_ = 0;
  uint64_t droppedWritten_ = 0;
  bool warnedDrop_ = false;
  bool flushWanted_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> lastStep_{-1};
  std::thread writer_;  // last: started once everything above exists
};

}  // namespace shoal::track
