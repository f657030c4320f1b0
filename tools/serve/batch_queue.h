// The dynamic-batching queue of shoal-serve: requests wait here until a worker takes them in a
// batch. No libtorch, no HTTP: T is whatever a request is (tests use ints).
//
// Batching rule: a worker's batch opens when its oldest request arrived, and closes when the
// requests waiting hold maxBatch rows (instances) or `window` has passed since that arrival,
// whichever is first; the worker then takes requests in arrival order while their rows fit in
// maxBatch. A request of more than maxBatch rows is refused at push(). So under light load a
// request waits at most `window`; under heavy load batches fill without waiting, and requests
// that queued while every worker was busy leave at once (their window has passed).
//
// Back-pressure: at most `limit` requests wait; push() beyond that answers kFull at once (the
// server's 503) rather than letting latency grow without bound.
//
// Threading: every method is thread-safe. push() never blocks. popBatch() blocks on a condition
// variable until a batch is due, `deadline` passes or close() is called. close() wakes every
// waiter; after it, push() answers kClosed and popBatch() hands out what is left, without
// waiting for windows, then returns empty batches.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "common/error.h"

namespace shoal::serve {

struct BatchQueueOptions {
  size_t maxBatch = 64;                    // rows per batch, >= 1
  std::chrono::microseconds window{2000};  // how long a batch may wait to fill
  size_t limit = 256;                      // requests waiting, >= 1
};

enum class PushResult { kAccepted, kFull, kClosed, kTooLarge };

template <typename T>
class BatchQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit BatchQueue(BatchQueueOptions options) : options_(options) {
    SHOAL_CHECK_GE(options_.maxBatch, size_t{1}, "batch queue: maxBatch");
    SHOAL_CHECK_GE(options_.limit, size_t{1}, "batch queue: limit");
    SHOAL_CHECK_GE(options_.window.count(), 0, "batch queue: window");
  }

  // Adds a request of `rows` instances (1..maxBatch). Never blocks.
  PushResult push(T item, size_t rows) {
    if (rows == 0 || rows > options_.maxBatch) return PushResult::kTooLarge;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return PushResult::kClosed;
      if (items_.size() >= options_.limit) return PushResult::kFull;
      items_.push_back({std::move(item), rows, Clock::now()});
      rows_ += rows;
    }
    // Every waiter: one may be waiting for its window, another for a first request.
    changed_.notify_all();
    return PushResult::kAccepted;
  }

  // The next batch (requests in arrival order, their rows summing to at most maxBatch), once
  // due by the batching rule. Empty if `deadline` passed first, or the queue is closed and
  // drained (closed() tells which).
  std::vector<T> popBatch(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (!changed_.wait_until(lock, deadline, [&] { return closed_ || !items_.empty(); })) {
        return {};
      }
      if (items_.empty()) return {};  // closed and drained
      // Wait for the window of the oldest request, unless the batch is already full.
      const auto due = items_.front().arrived + options_.window;
      const bool ready = changed_.wait_until(lock, std::min(due, deadline), [&] {
        return closed_ || items_.empty() || rows_ >= options_.maxBatch;
      });
      if (items_.empty()) continue;                 // another worker took them
      if (!ready && Clock::now() < due) return {};  // the caller's deadline came first
      std::vector<T> batch;
      size_t rows = 0;
      while (!items_.empty() && rows + items_.front().rows <= options_.maxBatch) {
        rows += items_.front().rows;
        rows_ -= items_.front().rows;
        batch.push_back(std::move(items_.front().item));
        items_.pop_front();
      }
      return batch;
    }
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }
  // Requests waiting now.
  size_t depth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }
  const BatchQueueOptions& options() const { return options_; }

 private:
  struct Entry {
    T item;
    size_t rows;
    Clock::time_point arrived;
  };

  const BatchQueueOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Entry> items_;
  size_t rows_ = 0;  // rows of items_
  bool closed_ = false;
};

}  // namespace shoal::serve
