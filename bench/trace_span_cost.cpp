// What one span of the timeline costs the thread that records it (common/trace.h): a span
// shaped like a collective's (Note [Operation spans] in comm/group.cpp: a name, ten arguments,
// among them two static texts and a copied group label) built, ended and recorded into a sink
// of the default capacity, against the bare clock reads a span cannot do without. Results:
// bench/results/observability.md.
//
//   trace_span_cost [--spans N] [--runs R]
//
// Each figure is the median over R runs of N spans (after one unmeasured run that fills the
// ring, so the sink's storage is at its high-water mark, as in a long job): nanoseconds per span.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/trace.h"

namespace {

using Clock = std::chrono::steady_clock;

double nsPer(Clock::time_point a, Clock::time_point b, size_t n) {
  return std::chrono::duration<double, std::nano>(b - a).count() / static_cast<double>(n);
}

// One collective's span, as comm::Group records it: begin, arguments, the first arrival's
// split, end, record.
void collectiveSpan(shoal::TraceSink& sink, const std::string& group, uint64_t seq) {
  shoal::TraceScope span(&sink, "allreduce", "comm");
  span.arg("seq", seq)
      .arg("bytes", uint64_t{4096})
      .arg("algorithm", shoal::StaticText{"ring"})
      .arg("transport", shoal::StaticText{"shm"})
      .arg("group", std::string_view(group))
      .arg("generation", uint64_t{0})
      .arg("group_rank", 0)
      .arg("group_size", 2);
  const int64_t arrival = sink.now();
  const int64_t end = span.stop();
  span.arg("wait_us", static_cast<double>(arrival - span.beginNs()) / 1e3)
      .arg("transfer_us", static_cast<double>(end - arrival) / 1e3);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t spans = 1'000'000;
  int runs = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--spans" && i + 1 < argc) {
      spans = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: trace_span_cost [--spans N] [--runs R]\n");
      return 2;
    }
  }
  if (spans < 1 || runs < 1) {
    std::fprintf(stderr, "trace_span_cost: --spans and --runs must be at least 1\n");
    return 2;
  }
  shoal::TraceSink sink;
  const std::string group = "world";
  for (size_t i = 0; i < std::max(spans, shoal::kDefaultTraceEvents); ++i) {
    collectiveSpan(sink, group, i);
  }
  std::vector<double> span, clock;
  int64_t sum = 0;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < spans; ++i) collectiveSpan(sink, group, i);
    auto t1 = Clock::now();
    span.push_back(nsPer(t0, t1, spans));
    // The three clock reads of a span (begin, first arrival, end), alone.
    t0 = Clock::now();
    for (size_t i = 0; i < spans; ++i) sum += sink.now() + sink.now() + sink.now();
    t1 = Clock::now();
    clock.push_back(nsPer(t0, t1, spans));
  }
  std::printf(
      "{\"spans\": %zu, \"runs\": %d, \"span_ns\": %.1f, \"three_clock_reads_ns\": %.1f, "
      "\"span_min_ns\": %.1f, \"span_max_ns\": %.1f, \"ignore\": %lld}\n",
      spans, runs, median(span), median(clock), *std::min_element(span.begin(), span.end()),
      *std::max_element(span.begin(), span.end()), static_cast<long long>(sum % 2));
  return 0;
}
