#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include "common/error.h"

namespace shoal {

namespace {

TraceArg* nextArg(TraceSpan& span, const char* key) {
  if (span.argCount >= kMaxTraceArgs) return nullptr;
  TraceArg& a = span.args[span.argCount++];
  a.key = key;
  return &a;
}

int64_t steadyNs(std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now()) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

void TraceSpan::addInt(const char* key, int64_t value) {
  if (TraceArg* a = nextArg(*this, key)) {
    a->kind = TraceArg::Kind::kInt;
    a->intValue = value;
  }
}

void TraceSpan::add(const char* key, double value) {
  if (TraceArg* a = nextArg(*this, key)) {
    a->kind = TraceArg::Kind::kDouble;
    a->doubleValue = value;
  }
}

void TraceSpan::add(const char* key, std::string_view value) {
  if (TraceArg* a = nextArg(*this, key)) {
    a->kind = TraceArg::Kind::kText;
    a->text.assign(value);
  }
}

TraceSink::TraceSink(TraceSinkOptions options)
    : capacity_(options.capacity),
      clockSkewNs_(options.clockSkewNs),
      clockDrift_(options.clockDrift),
      createdNs_(steadyNs()) {
  if (capacity_ < 1 || capacity_ > kMaxTraceEvents) {
    SHOAL_THROW(InvalidArgument, "trace capacity {}: expected 1 to {} spans", capacity_,
                kMaxTraceEvents);
  }
  if (!(clockDrift_ > -0.5 && clockDrift_ < 0.5)) {
    SHOAL_THROW(InvalidArgument, "trace clock drift {}: expected -0.5 to 0.5", clockDrift_);
  }
}

int64_t TraceSink::at(std::chrono::steady_clock::time_point steady) const {
  const int64_t t = steadyNs(steady);
  if (clockDrift_ == 0) return t + clockSkewNs_;
  return t + clockSkewNs_ + static_cast<int64_t>(static_cast<double>(t - createdNs_) * clockDrift_);
}

uint64_t TraceSink::currentThread() {
  // gettid is a system call; a thread asks once. (A cache of the kernel's answer, not state.)
  thread_local const uint64_t tid = static_cast<uint64_t>(::syscall(SYS_gettid));
  return tid;
}

void TraceSink::record(TraceSpan span) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  ++recorded_;
  if (ring_.size() < capacity_) {
    try {
      ring_.push_back(std::move(span));
    } catch (...) {
      ++dropped_;  // out of memory: losing a span beats failing the operation it describes
    }
    return;
  }
  // Full: overwrite the oldest.
  ring_[next_] = std::move(span);
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceSpan> TraceSink::snapshot(uint64_t* recorded, uint64_t* dropped) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recorded != nullptr) *recorded = recorded_;
  if (dropped != nullptr) *dropped = dropped_;
  std::vector<TraceSpan> out;
  out.reserve(ring_.size());
  // Before the ring is full next_ is 0 and this is the insertion order; after, next_ is the
  // oldest slot.
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

uint64_t TraceSink::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

uint64_t TraceSink::recorded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_;
}

TraceScope::TraceScope(TraceSink* sink, std::string_view name, const char* category) : sink_(sink) {
  if (sink_ == nullptr) return;
  span_.emplace();
  span_->name.assign(name);
  span_->category = category;
  span_->thread = TraceSink::currentThread();
  span_->beginNs = sink_->now();
}

int64_t TraceScope::stop() {
  if (!span_) return 0;
  if (!stopped_) span_->endNs = sink_->now();
  stopped_ = true;
  return span_->endNs;
}

TraceScope::~TraceScope() {
  if (!span_) return;
  stop();
  sink_->record(std::move(*span_));
}

}  // namespace shoal
