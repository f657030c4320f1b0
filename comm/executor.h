// Runs a group's operations one at a time, in the order they were issued.
//
// A synchronous call with nothing queued runs inline on the caller's thread (no thread hop on
// the latency path). Anything else goes to a background thread started on first use. Tasks
// never throw out of the executor: each reports through its Work.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace shoal::comm {

class Executor {
 public:
  Executor() = default;
  ~Executor();  // runs what is queued, then stops
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `task` on the caller's thread if the executor is idle; returns false (and does
  // nothing) if other tasks are queued or running.
  bool tryRunInline(const std::function<void()>& task);

  // Queues `task` behind everything issued before it.
  void submit(std::function<void()> task);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace shoal::comm
