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

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    error_ = std::move(error);
  }
  done_.notify_all();
}

}  // namespace shoal::comm
