#include "track/tracker.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "common/wall_clock.h"

namespace shoal::track {

namespace {

TrackerOptions checked(TrackerOptions options) {
  SHOAL_CHECK(!options.path.empty(), "Tracker needs the metrics store's path");
  SHOAL_CHECK_GE(options.rank, 0, "Tracker rank");
  SHOAL_CHECK_GE(options.maxQueued, size_t{1}, "Tracker maxQueued");
  SHOAL_CHECK(options.flushInterval.count() > 0, "Tracker flushInterval must be positive");
  return options;
}

}  // namespace

Tracker::Tracker(TrackerOptions options)
    : options_(checked(std::move(options))),
      wakeAt_(std::max<size_t>(1, options_.maxQueued / 2)),
      store_(std::make_unique<MetricsStore>(
          options_.path, MetricsStoreOptions{.busyTimeout = options_.storeBusyTimeout})) {
  nextSeq_ = store_->nextSeq(options_.rank);
  // Reserved once: the writer swaps buffers, so each keeps its capacity for the whole run.
  queue_.reserve(std::min<size_t>(options_.maxQueued, 4096));
  writer_ = std::thread([this] { writerLoop(); });
}

Tracker::~Tracker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  writer_.join();
  std::lock_guard lock(mutex_);
  if (error_ && logged_ > written_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      SHOAL_LOG_WARN("metrics of rank {}: {} points not written to {}: {}", options_.rank,
                     logged_ - written_, options_.path, e.what());
    }
  }
}

void Tracker::rethrowIfFailed() const {
  if (error_) std::rethrow_exception(error_);
}

bool Tracker::log(std::string_view name, int64_t step, double value) {
  if (name.empty() || name.size() > kMaxMetricNameBytes) {
    SHOAL_THROW(InvalidArgument, "metrics of rank {}: metric name of {} bytes (1 to {} allowed)",
                options_.rank, name.size(), kMaxMetricNameBytes);
  }
  const int64_t wallNs = wallClockNs();  // outside the lock
  std::lock_guard lock(mutex_);
  rethrowIfFailed();
  if (queue_.size() >= options_.maxQueued) {
    ++dropped_;
    return false;
  }
  auto it = names_.find(name);
  if (it == names_.end()) it = names_.emplace(name).first;
  queue_.push_back(MetricPoint{*it, step, value, wallNs, nextSeq_++});
  ++logged_;
  lastStep_.store(step, std::memory_order_relaxed);
  // Only on crossing the mark: one wake-up per batch, not one per point.
  if (queue_.size() == wakeAt_) wake_.notify_one();
  return true;
}

void Tracker::flush() {
  flush(options_.flushTimeout);
}

void Tracker::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mutex_);
  rethrowIfFailed();
  const uint64_t target = logged_;
  const uint64_t droppedTarget = dropped_;
  auto finished = [&] {
    return error_ || (written_ >= target && droppedWritten_ >= droppedTarget);
  };
  if (finished()) {
    rethrowIfFailed();
    return;
  }
  flushWanted_ = true;
  wake_.notify_one();
  const bool ok = done_.wait_until(lock, deadline, finished);
  rethrowIfFailed();
  if (!ok) {
    SHOAL_THROW(TimeoutError,
                "metrics store {}: flush of rank {} timed out after {:.3f} s with {} of {} points "
                "not yet written (the file is locked or slow)",
                options_.path, options_.rank, timeout.count() / 1000.0, target - written_, target);
  }
}

uint64_t Tracker::logged() const {
  std::lock_guard lock(mutex_);
  return logged_;
}

uint64_t Tracker::written() const {
  std::lock_guard lock(mutex_);
  return written_;
}

uint64_t Tracker::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

void Tracker::writerLoop() {
  std::vector<MetricPoint> batch;
  batch.reserve(queue_.capacity());
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, options_.flushInterval,
                   [&] { return stop_ || flushWanted_ || queue_.size() >= wakeAt_; });
    flushWanted_ = false;
    const uint64_t droppedNow = dropped_;
    if (queue_.empty() && droppedNow == droppedWritten_) {
      if (stop_) return;
      done_.notify_all();
      continue;
    }
    // The whole queue at once, in exchange for the empty buffer: log() keeps going meanwhile.
    batch.swap(queue_);
    const bool firstDrop = droppedNow > 0 && !warnedDrop_;
    warnedDrop_ = warnedDrop_ || firstDrop;
    lock.unlock();

    if (firstDrop) {
      SHOAL_LOG_WARN(
          "metrics of rank {}: buffer of {} points full, dropping points (counted in {}, "
          "table `dropped`); this warning is shown once",
          options_.rank, options_.maxQueued, options_.path);
    }
    std::exception_ptr error;
    try {
      store_->append(options_.rank, batch, droppedNow - droppedWritten_);
    } catch (...) {
      error = std::current_exception();
    }

    lock.lock();
    if (error) {
      // Kept for log() and flush(); the writer stops (see the header).
      error_ = error;
      done_.notify_all();
      return;
    }
    written_ += batch.size();
    droppedWritten_ = droppedNow;
    batch.clear();
    done_.notify_all();
  }
}

}  // namespace shoal::track
