#include "comm/work.h"

#include "common/error.h"
#include "common/log.h"

namespace shoal::comm {

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void Work::wait(Duration timeout) const {
  const Deadline deadline(timeout);
  advance(deadline);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_.wait_for(lock, deadline.remaining(), [&] { return finished_; })) {
    SHOAL_THROW(TimeoutError, "work did not complete within {:.1f} s",
                std::chrono::duration<double>(timeout).count());
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::advance(const Deadline& deadline) const {
  if (progress_ && !test()) progress_(deadline);
}

void Work::setProgress(std::function<void(const Deadline&)> progress) {
  progress_ = std::move(progress);
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::onDone(std::function<void(std::exception_ptr)> callback) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!finished_) {
    callbacks_.push_back(std::move(callback));
    return;
  }
  auto error = error_;
  lock.unlock();
  runCallback(callback, error);
}

std::shared_ptr<Work> Work::all(const std::vector<std::shared_ptr<Work>>& works) {
  auto combined = std::make_shared<Work>();
  if (works.empty()) {
    combined->finish(nullptr);
    return combined;
  }
  struct State {
    std::mutex mutex;
    size_t left;
    std::vector<std::exception_ptr> errors;
  };
  // Waiting on the whole moves each part forward in turn (the parts that can be).
  combined->setProgress([works](const Deadline& deadline) {
    for (const auto& w : works) {
      if (deadline.expired()) return;
      w->advance(deadline);
    }
  });
  auto state = std::make_shared<State>();
  state->left = works.size();
  state->errors.resize(works.size());
  for (size_t i = 0; i < works.size(); ++i) {
    works[i]->onDone([combined, state, i](std::exception_ptr error) {
      std::exception_ptr first;
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->errors[i] = error;
        if (--state->left > 0) return;
        for (auto& e : state->errors) {
          if (e) {
            first = e;
            break;
          }
        }
      }
      combined->finish(first);
    });
  }
  return combined;
}

void Work::finish(std::exception_ptr error) {
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Once finished, a work never changes its outcome: waiters may already have seen it.
    SHOAL_ASSERT(!finished_, "a work was finished twice");
    finished_ = true;
    error_ = error;
    callbacks.swap(callbacks_);
  }
  done_.notify_all();
  for (auto& cb : callbacks) runCallback(cb, error);
}

void Work::runCallback(const std::function<void(std::exception_ptr)>& callback,
                       std::exception_ptr error) noexcept {
  try {
    callback(error);
  } catch (const std::exception& e) {
    // The work's outcome is settled; the callback's own failure cannot change it. It must not
    // vanish either.
    SHOAL_LOG_WARN("a completion callback threw (ignored; the work's outcome stands): {}",
                   e.what());
  } catch (...) {
    SHOAL_LOG_WARN("a completion callback threw a non-standard exception (ignored)");
  }
}

}  // namespace shoal::comm
