#include "comm/executor.h"

namespace shoal::comm {

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

bool Executor::tryRunInline(const std::function<void()>& task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_ || !queue_.empty()) return false;
    busy_ = true;
  }
  struct Release {
    Executor* e;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(e->mutex_);
        e->busy_ = false;
      }
      e->changed_.notify_all();
    }
  } release{this};
  task();
  return true;
}

void Executor::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  }
  changed_.notify_all();
}

void Executor::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;  // stopping
    auto task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    task();  // tasks catch their own errors (see Group)
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace shoal::comm
