// A bounded recorder of timed spans: the sink behind Shoal's timeline (README "Timeline").
//
// What: complete spans (a name, a category, the recording thread, begin and end on this
// process's steady clock in nanoseconds, up to kMaxTraceArgs key/value arguments) kept in a ring
// of fixed capacity. When the ring is full the oldest span is overwritten and counted as
// dropped, so memory is bounded however long a job runs and the newest spans (those around a
// failure) are the ones kept.
//
// How it is passed: by std::shared_ptr<TraceSink> in the options of whoever records
// (comm::GroupOptions::trace); there is no process-wide sink. A null pointer means "not
// tracing", and TraceScope then costs a branch.
//
// Threading: record(), snapshot(), dropped() and the counters are thread-safe. Recording takes
// one short mutex to move the span into its slot; the span is built outside the lock. Names and
// text arguments of comm's spans are short enough to live inside std::string (no allocation).
//
// Clock: now() is CLOCK_MONOTONIC (std::chrono::steady_clock) plus TraceSinkOptions::clockSkewNs
// and clockDrift, which are zero except where a test emulates hosts whose clocks disagree and
// drift apart. Whoever measures this sink's offset against another rank (comm/clock_sync.h) must
// read the same clock (now()).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal {

// A collective's span carries up to ten (Note [Operation spans] in comm/group.cpp).
inline constexpr size_t kMaxTraceArgs = 10;
inline constexpr size_t kDefaultTraceEvents = 100000;
inline constexpr size_t kMaxTraceEvents = size_t{1} << 24;

// One argument of a span: a number or a short text. `key` must have static storage (a string
// literal): spans keep the pointer, not a copy.
struct TraceArg {
  enum class Kind : uint8_t { kInt, kDouble, kText };
  const char* key = "";
  Kind kind = Kind::kInt;
  int64_t intValue = 0;
  double doubleValue = 0;
  std::string text;
};

struct TraceSpan {
  std::string name;
  const char* category = "";  // static storage, like TraceArg::key
  uint64_t thread = 0;        // the recording thread's id (Linux tid)
  int64_t beginNs = 0;        // TraceSink::now() at begin and end
  int64_t endNs = 0;
  // 0: a span of `thread`, nested in time with that thread's others. Otherwise the id of an
  // asynchronous span (TraceSink::nextAsyncId()): work that overlaps others on the same thread,
  // such as point-to-point messages, shown on a track of its own.
  uint64_t asyncId = 0;
  std::array<TraceArg, kMaxTraceArgs> args;
  uint8_t argCount = 0;

  // Adds an argument; beyond kMaxTraceArgs it is ignored (spans stay bounded).
  template <std::integral T>
  void add(const char* key, T value) {
    addInt(key, static_cast<int64_t>(value));
  }
  void add(const char* key, double value);
  void add(const char* key, std::string_view value);
  void addInt(const char* key, int64_t value);
};

struct TraceSinkOptions {
  size_t capacity = kDefaultTraceEvents;  // spans kept, in [1, kMaxTraceEvents]
  int64_t clockSkewNs = 0;                // added to every now(): tests emulating other hosts
  // Tests emulating a clock that runs at another rate: now() gains clockDrift nanoseconds per
  // nanosecond since the sink was made (1e-4 is 100 ppm fast; in (-0.5, 0.5)).
  double clockDrift = 0;
};

class TraceSink {
 public:
  // InvalidArgument if the capacity is out of range. Allocates lazily: a sink that records
  // little costs little.
  explicit TraceSink(TraceSinkOptions options = {});
  TraceSink(const TraceSink&) = delete;
  TraceSink& operator=(const TraceSink&) = delete;

  // This sink's clock, in nanoseconds.
  int64_t now() const { return at(std::chrono::steady_clock::now()); }
  // This sink's clock at steady-clock time `t`: for an instant noted by code that knows no sink
  // (the transport's first arrival of an operation).
  int64_t at(std::chrono::steady_clock::time_point t) const;
  // The calling thread's id, as spans record it.
  static uint64_t currentThread();
  // A fresh id for an asynchronous span (never 0).
  uint64_t nextAsyncId() { return nextAsyncId_.fetch_add(1, std::memory_order_relaxed); }

  // Keeps `span`, overwriting the oldest when full. Never throws (a span that cannot be kept is
  // counted as dropped).
  void record(TraceSpan span) noexcept;

  // The spans kept, oldest first (a copy; recording goes on meanwhile), and where given, the
  // counters at the same instant.
  std::vector<TraceSpan> snapshot(uint64_t* recorded = nullptr, uint64_t* dropped = nullptr) const;
  size_t capacity() const { return capacity_; }
  // Spans overwritten (or not kept) so far.
  uint64_t dropped() const;
  // Spans recorded so far, kept or not.
  uint64_t recorded() const;

 private:
  const size_t capacity_;
  const int64_t clockSkewNs_;
  const double clockDrift_;
  const int64_t createdNs_;  // the steady clock when made: where the drift starts from
  std::atomic<uint64_t> nextAsyncId_{1};
  mutable std::mutex mutex_;
  // Grows to capacity_, then wraps. A deque, not a vector: growing never moves or frees a block.
  // A vector's reallocation frees multi-megabyte blocks, and glibc answers a freed mmapped block
  // by raising its mmap and trim thresholds, after which the engine's per-operation buffers are
  // returned to the kernel and faulted in again on every operation: 4 KiB all-reduces ran 3.5x
  // slower with a vector here (bench/results/observability.md).
  std::deque<TraceSpan> ring_;
  size_t next_ = 0;  // the slot the next span goes to, once full
  uint64_t recorded_ = 0;
  uint64_t dropped_ = 0;
};

// A span from construction to destruction on the constructing thread. With a null sink it does
// nothing (not even a clock read) and arg() returns at once. Not thread-safe; not copyable.
class TraceScope {
 public:
  TraceScope(TraceSink* sink, std::string_view name, const char* category);
  TraceScope(const std::shared_ptr<TraceSink>& sink, std::string_view name, const char* category)
      : TraceScope(sink.get(), name, category) {}
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  bool active() const { return span_.has_value(); }
  // When the span began, on its sink's clock (0 without a sink).
  int64_t beginNs() const { return span_ ? span_->beginNs : 0; }
  // Ends the span now and returns its end (0 without a sink), for arguments that need the same
  // instant; it is still recorded at destruction, with the arguments added meanwhile.
  int64_t stop();
  template <typename T>
  TraceScope& arg(const char* key, const T& value) {
    if (span_) span_->add(key, value);
    return *this;
  }

 private:
  TraceSink* sink_;
  std::optional<TraceSpan> span_;  // engaged only with a sink: nothing is built otherwise
  bool stopped_ = false;
};

}  // namespace shoal
