#include "comm/operation_times.h"

#include <algorithm>

namespace shoal::comm {

namespace {

// Sorted, disjoint spans covering the same time as `spans` (empty ones dropped).
std::vector<TimeSpan> merged(std::vector<TimeSpan> spans) {
  std::erase_if(spans, [](const TimeSpan& s) { return s.end <= s.begin; });
  std::sort(spans.begin(), spans.end(),
            [](const TimeSpan& a, const TimeSpan& b) { return a.begin < b.begin; });
  std::vector<TimeSpan> out;
  for (const TimeSpan& s : spans) {
    if (!out.empty() && s.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

TimeSpan clipped(TimeSpan s, const TimeSpan& window) {
  return {std::max(s.begin, window.begin), std::min(s.end, window.end)};
}

}  // namespace

OperationTimeLog::OperationTimeLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void OperationTimeLog::add(const OperationTime& record) {
  std::lock_guard lock(mutex_);
  if (records_.size() == capacity_) {
    records_.pop_front();
    ++dropped_;
  }
  records_.push_back(record);
}

std::vector<OperationTime> OperationTimeLog::take() {
  std::lock_guard lock(mutex_);
  std::vector<OperationTime> out(records_.begin(), records_.end());
  records_.clear();
  return out;
}

size_t OperationTimeLog::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

BlockedTime splitBlockedTime(const std::vector<OperationTime>& ops,
                             const std::vector<TimeSpan>& waits, std::thread::id thread,
                             TimeSpan window) {
  std::vector<TimeSpan> blocked, waiting;
  for (const TimeSpan& w : waits) blocked.push_back(clipped(w, window));
  for (const OperationTime& op : ops) {
    if (op.thread == thread) blocked.push_back(clipped({op.start, op.end}, window));
    if (op.firstArrival != Clock::time_point{}) {
      waiting.push_back(clipped({op.start, std::min(op.firstArrival, op.end)}, window));
    }
  }
  blocked = merged(std::move(blocked));
  waiting = merged(std::move(waiting));
  // Both sorted and disjoint: one pass measures their intersection.
  Clock::duration total{}, both{};
  for (const TimeSpan& b : blocked) total += b.end - b.begin;
  for (size_t i = 0, j = 0; i < blocked.size() && j < waiting.size();) {
    const auto from = std::max(blocked[i].begin, waiting[j].begin);
    const auto to = std::min(blocked[i].end, waiting[j].end);
    if (from < to) both += to - from;
    if (blocked[i].end < waiting[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return {.waitingSeconds = seconds(both), .communicationSeconds = seconds(total - both)};
}

}  // namespace shoal::comm
