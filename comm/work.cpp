#include "comm/work.h"

#include "common/error.h"

namespace shoal::comm {

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void Work::wait(Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_.wait_for(lock, timeout, [&] { return finished_; })) {
    SHOAL_THROW(TimeoutError, "work did not complete within {:.1f} s",
                std::chrono::duration<double>(timeout).count());
  }
  if (error_) std::rethrow_exception(error_);
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
  callback(error);
}

void Work::finish(std::exception_ptr error) {
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    error_ = error;
    callbacks.swap(callbacks_);
  }
  done_.notify_all();
  for (auto& cb : callbacks) cb(error);
}

}  // namespace shoal::comm
