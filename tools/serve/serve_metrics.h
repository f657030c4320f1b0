// shoal-serve's counters, rendered as Prometheus text for GET /metrics. No libtorch, no HTTP.
//
// What it counts: requests by route and HTTP status; batches and the instances in them (a histogram
// of batch sizes, so the mean and the spread of batching are visible); request latency from arrival
// to answer (a histogram in seconds, from which Prometheus computes quantiles, plus sum and
// count); model reloads and failed reloads. Gauges known only to the server (queue depth, the
// model's version) are passed to render().
//
// Threading: every method is thread-safe (one mutex; each update is a few additions).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace shoal::serve {

struct ServeGauges {
  size_t queueDepth = 0;  // requests waiting for a batch
  size_t queueLimit = 0;
  size_t batchesInFlight = 0;  // forwards running now
  uint64_t modelVersion = 0;   // 1 for the model loaded at start, +1 per reload
};

class ServeMetrics {
 public:
  // Upper bounds of the latency buckets, seconds (Prometheus `le`), and of batch-size buckets.
  static constexpr std::array<double, 14> kLatencyBounds = {
      0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0};
  static constexpr std::array<double, 8> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128};

  // Every answer, by route ("predict", "healthz", "metrics"; anything else "other", so unknown
  // paths cannot grow the label set) and status (404s and 413s included).
  void countStatus(const std::string& route, int status);
  // A prediction's time from arrival to answer.
  void observeLatency(double seconds);
  void countBatch(size_t instances, size_t requests);
  void countReload(bool ok);

  std::string render(const ServeGauges& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> byStatus_;
  std::array<uint64_t, kLatencyBounds.size() + 1> latency_{};  // last: +Inf
  double latencySum_ = 0;
  uint64_t latencyCount_ = 0;
  std::array<uint64_t, kBatchBounds.size() + 1> batch_{};
  uint64_t batches_ = 0, batchInstances_ = 0, batchRequests_ = 0;
  uint64_t reloads_ = 0, reloadFailures_ = 0;
};

}  // namespace shoal::serve
