// tools/serve/serve_metrics.h.
#include "tools/serve/serve_metrics.h"

#include <fmt/format.h>

namespace shoal::serve {

namespace {

template <size_t N>
size_t bucketOf(const std::array<double, N>& bounds, double v) {
  size_t i = 0;
  while (i < N && v > bounds[i]) ++i;
  return i;
}

template <size_t N, size_t M>
void histogram(std::string& out, const char* name, const std::array<double, N>& bounds,
               const std::array<uint64_t, M>& counts, double sum, uint64_t count) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < N; ++i) {
    cumulative += counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count, name,
                     sum, name, count);
}

}  // namespace

void ServeMetrics::countStatus(const std::string& route, int status) {
  const bool known = route == "predict" || route == "healthz" || route == "metrics";
  std::lock_guard<std::mutex> lock(mutex_);
  ++byStatus_[{known ? route : "other", status}];
}

void ServeMetrics::observeLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++latency_[bucketOf(kLatencyBounds, seconds)];
  latencySum_ += seconds;
  ++latencyCount_;
}

void ServeMetrics::countBatch(size_t instances, size_t requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++batch_[bucketOf(kBatchBounds, static_cast<double>(instances))];
  ++batches_;
  batchInstances_ += instances;
  batchRequests_ += requests;
}

void ServeMetrics::countReload(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(ok ? reloads_ : reloadFailures_);
}

std::string ServeMetrics::render(const ServeGauges& g) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  out +=
      "# HELP shoal_serve_requests_total HTTP requests answered, by route and status code.\n"
      "# TYPE shoal_serve_requests_total counter\n";
  for (const auto& [key, n] : byStatus_) {
    out += fmt::format("shoal_serve_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  out +=
      "# HELP shoal_serve_request_seconds Time from a prediction request's arrival to its answer.\n"
      "# TYPE shoal_serve_request_seconds histogram\n";
  histogram(out, "shoal_serve_request_seconds", kLatencyBounds, latency_, latencySum_,
            latencyCount_);
  out +=
      "# HELP shoal_serve_batch_instances Instances per forward pass.\n"
      "# TYPE shoal_serve_batch_instances histogram\n";
  histogram(out, "shoal_serve_batch_instances", kBatchBounds, batch_,
            static_cast<double>(batchInstances_), batches_);
  out += fmt::format(
      "# HELP shoal_serve_batch_requests_total Requests served by all batches.\n"
      "# TYPE shoal_serve_batch_requests_total counter\n"
      "shoal_serve_batch_requests_total {}\n"
      "# TYPE shoal_serve_queue_depth gauge\nshoal_serve_queue_depth {}\n"
      "# TYPE shoal_serve_queue_limit gauge\nshoal_serve_queue_limit {}\n"
      "# TYPE shoal_serve_batches_in_flight gauge\nshoal_serve_batches_in_flight {}\n"
      "# TYPE shoal_serve_model_version gauge\nshoal_serve_model_version {}\n"
      "# TYPE shoal_serve_model_reloads_total counter\nshoal_serve_model_reloads_total {}\n"
      "# TYPE shoal_serve_model_reload_failures_total counter\n"
      "shoal_serve_model_reload_failures_total {}\n",
      batchRequests_, g.queueDepth, g.queueLimit, g.batchesInFlight, g.modelVersion, reloads_,
      reloadFailures_);
  return out;
}

}  // namespace shoal::serve
