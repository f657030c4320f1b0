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
// one short mutex to move the span into its slot; the span is built outside the lock. A comm
// span allocates nothing: its name and copied texts are short enough to live inside
// std::string, and the names of algorithms and transports are StaticText.
//
// Clock: now() is CLOCK_MONOTONIC (std::chrono::steady_clock) plus TraceSinkOptions::clockSkewNs
// and clockDrift, which are zero except where a test emulates hosts whose clocks disagree and
// drift apart. Whoever measures this sink's offset against another rank (comm/clock_sync.h) must
// read the same clock (now()).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace shoal {

// A collective's span carries up to twelve (Note [Operation spans] in comm/group.cpp).
inline constexpr size_t kMaxTraceArgs = 12;
inline constexpr size_t kDefaultTraceEvents = 100000;
inline constexpr size_t kMaxTraceEvents = size_t{1} << 24;

// Text with static storage (a literal, a name from a static table): a span keeps the pointer
// instead of a copy.
struct StaticText {
  std::string_view text;
};

// One argument of a span: a number or a text. `key` must have static storage (a string
// literal): spans keep the pointer, not a copy. Trivially copyable on purpose: a span's
// arguments are built, moved into the ring and overwritten on every traced operation, and
// arguments holding strings of their own made that most of a span's cost
// (bench/results/observability.md). Read a text with TraceSpan::text().
struct TraceArg {
  enum class Kind : uint8_t { kInt, kDouble, kText, kStaticText };
  const char* key = "";
  Kind kind = Kind::kInt;
  uint32_t textSize = 0;  // kText and kStaticText
  union {
    int64_t intValue = 0;
    double doubleValue;
    uint64_t textOffset;     // kText: where the text starts in TraceSpan::texts
    const char* staticText;  // kStaticText
  };
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
  // The copied texts of the kText arguments, back to back (one buffer for all of them; short
  // ones fit in the string itself).
  std::string texts;

  // Adds an argument; beyond kMaxTraceArgs it is ignored (spans stay bounded).
  // (Not a concept: the fuzz targets that include libtorch build as C++17, fuzz/CMakeLists.txt.)
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  void add(const char* key, T value) {
    addInt(key, static_cast<int64_t>(value));
  }
  void add(const char* key, double value);
  void add(const char* key, std::string_view value);  // copied
  void add(const char* key, StaticText value);        // the pointer is kept
  void addInt(const char* key, int64_t value);
  // A text argument's text (empty for a number).
  std::string_view text(const TraceArg& arg) const;
};

// An error's first line, shortened to at most 160 characters: a span's "error" argument.
std::string traceErrorLine(std::exception_ptr error);

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
  void record(TraceSpan&& span) noexcept;

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
  // The ring: slot i is chunks_[i / kChunkSpans][i % kChunkSpans]. Chunks are added as the ring
  // fills, up to capacity_, and are never moved or freed while the sink lives. A vector of spans
  // would move and free multi-megabyte blocks as it grew, and glibc answers a freed mmapped
  // block by raising its mmap and trim thresholds, after which the engine's per-operation
  // buffers were returned to the kernel and faulted in again on every operation: 4 KiB
  // all-reduces ran 3.5x slower (bench/results/observability.md). A deque avoided that but
  // allocated every span on its own (a span is larger than its block).
  static constexpr size_t kChunkSpans = 256;
  std::vector<std::unique_ptr<TraceSpan[]>> chunks_;
  size_t size_ = 0;  // spans in the ring, up to capacity_
  TraceSpan& slot(size_t i) const { return chunks_[i / kChunkSpans][i % kChunkSpans]; }
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
