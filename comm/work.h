// Handle to an asynchronous collective.
//
// Thread-safe. The buffers passed to the collective belong to it until the work completes
// (test() returns true or wait() returns/throws); touching them earlier is a data race.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "common/deadline.h"

namespace shoal::comm {

class Work {
 public:
  // True once the work finished, successfully or not. Never blocks.
  bool test() const;

  // Blocks until the work finishes or `timeout` passes (TimeoutError; the work keeps running
  // under its own deadline). Rethrows the collective's error if it failed.
  void wait(Duration timeout = std::chrono::hours(24 * 365)) const;

  // The error the work failed with, or null (also null while still running).
  std::exception_ptr error() const;

  // Executor side.
  void finish(std::exception_ptr error);

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable done_;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace shoal::comm
