// shoal-serve's HTTP server: JSON predictions from one model, with dynamic batching
// (tools/serve/batch_queue.h), reload on file change (tools/serve/model_reloader.h) and
// Prometheus metrics (tools/serve/serve_metrics.h). README "Serving" lists the endpoints:
//   POST /v1/predict   tools/serve/predict_request.h; 200, or 400 (bad input, one-line JSON
//                      error), 413 (body over maxBody), 503 (queue full or stopping), 504 (no
//                      answer within requestTimeout), 500 (the forward failed)
//   GET  /healthz      {"status": "ok", "model": NAME, "model_version": V}
//   GET  /metrics      Prometheus text
// Anything else: 404 {"error": "not found"}.
//
// Threading: requests are read and parsed on the HTTP pool's threads (httpThreads), which
// enqueue them and wait for the answer; `workers` threads take batches, run one forward each on
// the current model, and hand every request its rows. start() and stop() from one controlling
// thread. Blocking: start() waits at most kStartTimeout for the listener; stop() stops accepting,
// lets requests in flight finish (each bounded by requestTimeout), then joins workers and the
// watcher. The destructor stops and never throws.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tools/serve/batch_queue.h"

namespace shoal::serve {

struct ServeOptions {
  std::string modelName = "fashion_cnn";
  std::string modelPath;
  std::string host = "127.0.0.1";
  int port = 8500;  // 0: a free one (see port())
  BatchQueueOptions batching;
  size_t workers = 1;       // threads running forwards
  size_t httpThreads = 64;  // connections served at once (a keep-alive connection holds one)
  size_t maxBody = 4 << 20;
  std::chrono::milliseconds requestTimeout{30000};
  bool watch = false;
  std::chrono::milliseconds watchInterval{500};
  // For tests only: each forward first waits this long, holding its worker, so that a test can
  // fill the queue deterministically.
  std::chrono::milliseconds debugForwardDelay{0};
};

inline constexpr std::chrono::seconds kStartTimeout{10};

class PredictServer {
 public:
  // Checks the options (InvalidArgument: port outside 0..65535, zero workers or threads) and
  // loads the model (what ServedModel::load throws).
  explicit PredictServer(ServeOptions options);
  ~PredictServer();
  PredictServer(const PredictServer&) = delete;
  PredictServer& operator=(const PredictServer&) = delete;

  // Binds, starts workers, watcher and listener; returns once requests are accepted.
  // SystemError if the address cannot be bound; TimeoutError if listening did not start.
  void start();
  void stop();  // idempotent

  int port() const { return port_.load(); }
  std::string url() const;  // http://HOST:PORT/ once started

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int> port_{0};
};

}  // namespace shoal::serve
