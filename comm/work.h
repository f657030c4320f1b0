// Handle to an asynchronous collective.
//
// Thread-safe. The buffers passed to the collective belong to it until the work completes
// (test() returns true or wait() returns/throws); touching them earlier is a data race.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

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

  // Calls `callback` with the error (null on success) once the work finished: at once on this
  // thread if it already has, else on the thread that finishes it (the group's executor), so
  // the callback must be short and must not wait on the same group. A callback that throws is
  // logged and ignored: the work's outcome is already settled.
  void onDone(std::function<void(std::exception_ptr)> callback);

  // A work that completes when every one of `works` did: with the first error (in the order
  // given) if any failed, else successfully. Completes at once for an empty list.
  static std::shared_ptr<Work> all(const std::vector<std::shared_ptr<Work>>& works);

  // Executor side: called exactly once (a second call is an InternalError).
  void finish(std::exception_ptr error);

 private:
  static void runCallback(const std::function<void(std::exception_ptr)>& callback,
                          std::exception_ptr error) noexcept;
  mutable std::mutex mutex_;
  mutable std::condition_variable done_;
  bool finished_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
};

}  // namespace shoal::comm
