// Deadlines on the steady clock. Every blocking wait in Shoal takes one.
#pragma once

#include <algorithm>
#include <chrono>

namespace shoal {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;

class Deadline {
 public:
  explicit Deadline(Duration timeout) : start_(Clock::now()), end_(start_ + timeout) {}

  bool expired() const { return Clock::now() >= end_; }
  Duration remaining() const { return std::max(Duration(0), Duration(end_ - Clock::now())); }
  // Milliseconds left, rounded up so a wait never returns early with time still on the clock.
  int remainingMs() const {
    auto ns = remaining().count();
    return static_cast<int>(std::min<long long>((ns + 999'999) / 1'000'000, 1 << 30));
  }
  double elapsedSeconds() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }
  double timeoutSeconds() const { return std::chrono::duration<double>(end_ - start_).count(); }
  Clock::time_point start() const { return start_; }
  Clock::time_point end() const { return end_; }

 private:
  Clock::time_point start_;
  Clock::time_point end_;
};

inline Duration seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace shoal
