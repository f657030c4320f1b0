// tools/serve/predict_server.h.
#include "tools/serve/predict_server.h"

#include <httplib.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "common/error.h"
#include "common/log.h"
#include "tools/serve/model_reloader.h"
#include "tools/serve/predict_request.h"
#include "tools/serve/serve_metrics.h"

namespace shoal::serve {

namespace {

using Clock = std::chrono::steady_clock;

struct Answer {
  int status = 500;
  std::string body;
};

// One request waiting in the queue: its parsed input and where its answer goes. Shared between
// the HTTP thread and the worker, so a request that timed out can still be answered into the
// void.
struct Pending {
  PredictInput input;
  std::promise<Answer> answer;
};
using PendingPtr = std::shared_ptr<Pending>;

void reply(httplib::Response& res, int status, std::string body) {
  res.status = status;
  res.set_content(std::move(body), "application/json");
}

}  // namespace

struct PredictServer::Impl {
  explicit Impl(ServeOptions o)
      : options(std::move(o)),
        reloader({options.modelName, options.modelPath, options.watchInterval}, metrics),
        queue(options.batching) {}

  // Note [Worker loop]: one forward per batch on the model current when the batch is taken; a
  // reload during the forward affects the next batch only. A forward that throws answers its
  // requests 500 and the worker goes on.
  void workerLoop() {
    for (;;) {
      std::vector<PendingPtr> batch = queue.popBatch(Clock::now() + std::chrono::seconds(1));
      if (batch.empty()) {
        if (queue.closed()) return;
        continue;
      }
      ++inFlight;
      const auto model = reloader.current();
      size_t rows = 0;
      for (const auto& p : batch) rows += p->input.instances;
      std::vector<float> values;
      const float* data = batch[0]->input.values.data();
      if (batch.size() > 1) {  // one request needs no copy
        values.reserve(rows * model->instanceSize());
        for (const auto& p : batch) {
          values.insert(values.end(), p->input.values.begin(), p->input.values.end());
        }
        data = values.data();
      }
      if (options.debugForwardDelay.count() > 0)
        std::this_thread::sleep_for(options.debugForwardDelay);
      // Counted before any answer goes out: a client that has its answer finds its batch counted.
      metrics.countBatch(rows, batch.size());
      try {
        const std::vector<float> out = model->forward(data, rows);
        size_t row = 0;
        for (const auto& p : batch) {
          p->answer.set_value(
              {200, formatPredictResponse(out.data() + row * model->classes(), p->input.instances,
                                          model->classes(), model->version())});
          row += p->input.instances;
        }
      } catch (const std::exception& e) {
        SHOAL_LOG_WARN("shoal-serve: a forward of {} instances failed: {}", rows, e.what());
        for (const auto& p : batch) {
          p->answer.set_value({500, errorJson(std::string("the forward failed: ") + e.what())});
        }
      }
      --inFlight;
    }
  }

  void predict(const httplib::Request& req, httplib::Response& res) {
    const auto started = Clock::now();
    const auto model = reloader.current();
    auto pending = std::make_shared<Pending>();
    try {
      pending->input =
          parsePredictRequest(req.body, model->instanceSize(), options.batching.maxBatch);
    } catch (const InvalidArgument& e) {
      reply(res, 400, errorJson(e.what()));
      return;
    }
    std::future<Answer> answer = pending->answer.get_future();
    const size_t rows = pending->input.instances;
    switch (queue.push(pending, rows)) {
      case PushResult::kAccepted:
        break;
      case PushResult::kFull:
        reply(res, 503,
              errorJson(fmt::format("the queue is full ({} requests waiting); retry later",
                                    options.batching.limit)));
        return;
      case PushResult::kClosed:
        reply(res, 503, errorJson("the server is stopping"));
        return;
      case PushResult::kTooLarge:  // parsePredictRequest bounds it already
        reply(res, 400, errorJson("too many instances in one request"));
        return;
    }
    if (answer.wait_for(options.requestTimeout) != std::future_status::ready) {
      reply(res, 504,
            errorJson(fmt::format("no answer within {} ms", options.requestTimeout.count())));
      return;
    }
    Answer a = answer.get();
    reply(res, a.status, std::move(a.body));
    metrics.observeLatency(std::chrono::duration<double>(Clock::now() - started).count());
  }

  void install() {
    server.set_read_timeout(std::chrono::seconds(5));
    server.set_write_timeout(std::chrono::seconds(5));
    server.set_keep_alive_timeout(5);
    server.set_keep_alive_max_count(1000);
    // An answer is written as headers then body: with Nagle's algorithm the body waits for the
    // client's delayed ACK of the headers, 40 ms on Linux (measured: 96 ms per request, one
    // client).
    server.set_tcp_nodelay(true);
    server.set_payload_max_length(options.maxBody);
    server.Post("/v1/predict",
                [this](const httplib::Request& req, httplib::Response& res) { predict(req, res); });
    server.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      const auto m = reloader.current();
      reply(res, 200,
            fmt::format(R"({{"status":"ok","model":"{}","model_version":{}}})", m->name(),
                        m->version()));
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      ServeGauges g;
      g.queueDepth = queue.depth();
      g.queueLimit = options.batching.limit;
      g.batchesInFlight = inFlight.load();
      g.modelVersion = reloader.current()->version();
      res.set_content(metrics.render(g), "text/plain; version=0.0.4");
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          reply(res, 500, errorJson(what));
        });
    // Unknown routes, wrong methods, bodies over maxBody: the same one-line JSON.
    server.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message = "request refused";
      if (res.status == 404) message = "not found";
      if (res.status == 413) {
        message = fmt::format("the body is larger than the {} bytes allowed (--max-body)",
                              options.maxBody);
      }
      reply(res, res.status, errorJson(message));
    });
    // Counted before the response is written (the logger runs after): a client that has its
    // answer must find it counted in /metrics.
    server.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::string& p = req.path;
      metrics.countStatus(p == "/v1/predict" ? "predict"
                          : p.size() > 1     ? p.substr(1)
                                             : p,
                          res.status);
    });
    server.new_task_queue = [this] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        listening = true;
      }
      listeningChanged.notify_all();
      return new httplib::ThreadPool(options.httpThreads);
    };
  }

  const ServeOptions options;
  ServeMetrics metrics;
  ModelReloader reloader;
  BatchQueue<PendingPtr> queue;
  std::atomic<size_t> inFlight{0};
  std::vector<std::thread> workers;
  httplib::Server server;
  std::thread listener;
  std::mutex mutex;
  std::condition_variable listeningChanged;
  bool listening = false;
  bool started = false;
};

PredictServer::PredictServer(ServeOptions options) {
  if (options.port < 0 || options.port > 65535) {
    SHOAL_THROW(InvalidArgument, "port {} is not in 0..65535", options.port);
  }
  SHOAL_CHECK_GE(options.workers, size_t{1}, "--workers");
  SHOAL_CHECK_GE(options.httpThreads, size_t{1}, "--http-threads");
  SHOAL_CHECK_GE(options.maxBody, size_t{1}, "--max-body");
  impl_ = std::make_unique<Impl>(std::move(options));
}

PredictServer::~PredictServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    SHOAL_LOG_WARN("shoal-serve: stopping: {}", e.what());
  }
}

void PredictServer::start() {
  Impl& s = *impl_;
  if (s.started) return;
  s.install();
  int port = s.options.port;
  if (port == 0) {
    port = s.server.bind_to_any_port(s.options.host);
  } else if (!s.server.bind_to_port(s.options.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    SHOAL_THROW(SystemError, "cannot listen on {}:{} (in use, or not an address of this host)",
                s.options.host, s.options.port);
  }
  s.started = true;
  for (size_t i = 0; i < s.options.workers; ++i) s.workers.emplace_back([&s] { s.workerLoop(); });
  if (s.options.watch) s.reloader.start();
  s.listener = std::thread([&s] { s.server.listen_after_bind(); });
  std::unique_lock<std::mutex> wait(s.mutex);
  if (!s.listeningChanged.wait_for(wait, kStartTimeout, [&s] { return s.listening; })) {
    SHOAL_THROW(TimeoutError, "the server thread did not start listening within {} s",
                kStartTimeout.count());
  }
  port_ = port;
}

void PredictServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.started = false;
  // Listener first: its pool finishes the requests in flight, which need the workers alive.
  s.server.stop();
  if (s.listener.joinable()) s.listener.join();
  s.queue.close();
  for (auto& w : s.workers) w.join();
  s.workers.clear();
  s.reloader.stop();
  port_ = 0;
}

std::string PredictServer::url() const {
  const int p = port();
  if (p == 0) return "";
  const std::string& host = impl_->options.host;
  return fmt::format("http://{}:{}/", host.find(':') != std::string::npos ? "[" + host + "]" : host,
                     p);
}

}  // namespace shoal::serve
