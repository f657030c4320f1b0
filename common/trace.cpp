#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

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
    a->textOffset = texts.size();
    a->textSize = static_cast<uint32_t>(std::min<size_t>(value.size(), UINT32_MAX));
    texts.append(value.substr(0, a->textSize));
  }
}

void TraceSpan::add(const char* key, StaticText value) {
  if (TraceArg* a = nextArg(*this, key)) {
    a->kind = TraceArg::Kind::kStaticText;
    a->staticText = value.text.data();
    a->textSize = static_cast<uint32_t>(std::min<size_t>(value.text.size(), UINT32_MAX));
  }
}

std::string_view TraceSpan::text(const TraceArg& arg) const {
  switch (arg.kind) {
    case TraceArg::Kind::kText:
      return std::string_view(texts).substr(arg.textOffset, arg.textSize);
    case TraceArg::Kind::kStaticText:
      return std::string_view(arg.staticText, arg.textSize);
    default:
      return {};
  }
}

std::string traceErrorLine(std::exception_ptr error) {
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
    text = "unknown error";
  }
  text = text.substr(0, text.find('\n'));
  if (text.size() > 160) text = text.substr(0, 157) + "...";
  return text;
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

void TraceSink::record(TraceSpan&& span) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  ++recorded_;
  if (size_ < capacity_) {
    if (size_ == chunks_.size() * kChunkSpans) {
      try {
        chunks_.push_back(std::make_unique<TraceSpan[]>(std::min(kChunkSpans, capacity_ - size_)));
      } catch (...) {
        ++dropped_;  // out of memory: losing a span beats failing the operation it describes
        return;
      }
    }
    slot(size_++) = std::move(span);
    return;
  }
  // Full: overwrite the oldest.
  slot(next_) = std::move(span);
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceSpan> TraceSink::snapshot(uint64_t* recorded, uint64_t* dropped) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recorded != nullptr) *recorded = recorded_;
  if (dropped != nullptr) *dropped = dropped_;
  std::vector<TraceSpan> out;
  out.reserve(size_);
  // Before the ring is full next_ is 0 and this is the insertion order; after, next_ is the
  // oldest slot.
  for (size_t i = 0; i < size_; ++i) out.push_back(slot((next_ + i) % size_));
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
