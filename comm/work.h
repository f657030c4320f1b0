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
  // under its own deadline). Rethrows the collective's error if it failed. A work that can be
  // moved forward by the waiting thread (point-to-point, see setProgress) is moved by it.
  void wait(Duration timeout = std::chrono::hours(24 * 365)) const;

  // Moves the work forward on this thread if it has a way to (setProgress), returning when it
  // finished, when it cannot be moved from here right now, or at `deadline`. Never throws:
  // failures finish the work. Called by wait(); for Work::all and the like.
  void advance(const Deadline& deadline) const;

  // Producer side, before the work is shared: `progress` moves this work forward on the
  // calling thread, with advance()'s contract. Why: a thread that is going to block anyway
  // can move the bytes itself, saving the two thread hand-offs (to a progress thread and back)
  // that dominate small messages.
  void setProgress(std::function<void(const Deadline&)> progress);

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
  std::function<void(const Deadline&)> progress_;  // set before sharing; then read-only
};

}  // namespace shoal::comm
