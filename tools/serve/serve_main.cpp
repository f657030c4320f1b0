// shoal-serve: HTTP predictions from a trained model, with dynamic batching
// (tools/serve/predict_server.h; README "Serving").
//
//   shoal-serve MODEL_FILE [--model fashion_cnn|fashion_mlp] [--port 8500] [--host 127.0.0.1]
//               [--max-batch 64] [--batch-window-us 2000] [--queue-limit 256] [--workers 1]
//               [--torch-threads N] [--http-threads 64] [--max-body BYTES]
//               [--request-timeout-ms 30000] [--watch] [--watch-interval-ms 500] [--no-mkldnn]
//
// Prints "shoal-serve: serving MODEL (FILE) at http://HOST:PORT/" once requests are accepted
// (with --port 0, the port the system chose), then serves until SIGINT or SIGTERM, and exits 0
// after finishing the requests in flight. Bad options: one line on stderr, exit code 2; a model
// that does not load or an address that cannot be bound: exit code 1.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "tools/serve/predict_server.h"
#include "train/export/served_model.h"

namespace {

using shoal::parseInteger;

int serve(shoal::serve::ServeOptions options, const shoal::serve::TorchRuntime& runtime) {
  // Signals are taken by sigwait below, on this thread only: blocked before any thread starts,
  // so every thread inherits the mask and none is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A shell starts background jobs with SIGINT ignored, and an ignored signal is discarded
  // rather than left pending for sigwait: the default action makes it wait for us instead.
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  shoal::serve::configureTorchRuntime(runtime);
  const std::string model = options.modelName, path = options.modelPath;
  shoal::serve::PredictServer server(std::move(options));
  server.start();
  fmt::print("shoal-serve: serving {} ({}) at {}\n", model, path, server.url());
  std::fflush(stdout);
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  server.stop();
  fmt::print("shoal-serve: stopped on signal {}\n", signal);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shoal-serve: HTTP predictions from a trained model, batched"};
  shoal::serve::ServeOptions o;
  std::string port = "8500", maxBatch = "64", window = "2000", queueLimit = "256", workers = "1",
              torchThreads, httpThreads = "64", maxBody = std::to_string(4 << 20),
              timeout = "30000", watchInterval = "500", debugDelay = "0";
  app.add_option("MODEL_FILE", o.modelPath,
                 "the weights: a torch::save file, a pickled state_dict (shoal-export) or "
                 "safetensors")
      ->required();
  app.add_option("--model", o.modelName, "the architecture: fashion_cnn (default) or fashion_mlp");
  app.add_option("--host", o.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", port, "port (default 8500; 0: a free one, printed)");
  app.add_option("--max-batch", maxBatch, "most instances in one forward (default 64)");
  app.add_option("--batch-window-us", window,
                 "how long a batch waits to fill after its first request, microseconds "
                 "(default 2000)");
  app.add_option("--queue-limit", queueLimit,
                 "requests waiting at most; more are answered 503 (default 256)");
  app.add_option("--workers", workers, "threads running forwards, sharing the model (default 1)");
  app.add_option("--torch-threads", torchThreads,
                 "libtorch threads per forward (default: cores / workers)");
  app.add_option("--http-threads", httpThreads,
                 "connections served at once (default 64; a keep-alive connection holds one)");
  app.add_option("--max-body", maxBody, "largest request body in bytes (default 4 MiB; 413)");
  app.add_option("--request-timeout-ms", timeout, "answer 504 after this long (default 30000)");
  app.add_flag("--watch", o.watch, "reload MODEL_FILE when it changes (write it and rename it in)");
  app.add_option("--watch-interval-ms", watchInterval, "how often --watch looks (default 500)");
  app.add_option("--debug-forward-delay-ms", debugDelay,
                 "for tests: each forward first waits this long");
  shoal::serve::TorchRuntime runtime;
  bool noMkldnn = false;
  app.add_flag("--no-mkldnn", noMkldnn,
               "native convolutions instead of oneDNN (faster for FashionCnn batches on some "
               "hosts: bench/results/serve.md)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    o.port = static_cast<int>(parseInteger("--port", port, 0, 65535));
    o.batching.maxBatch = static_cast<size_t>(parseInteger("--max-batch", maxBatch, 1, 4096));
    o.batching.window =
        std::chrono::microseconds(parseInteger("--batch-window-us", window, 0, 10000000));
    o.batching.limit = static_cast<size_t>(parseInteger("--queue-limit", queueLimit, 1, 1 << 20));
    o.workers = static_cast<size_t>(parseInteger("--workers", workers, 1, 256));
    o.httpThreads = static_cast<size_t>(parseInteger("--http-threads", httpThreads, 1, 4096));
    o.maxBody = static_cast<size_t>(parseInteger("--max-body", maxBody, 1, int64_t{1} << 32));
    o.requestTimeout =
        std::chrono::milliseconds(parseInteger("--request-timeout-ms", timeout, 1, 3600000));
    o.watchInterval =
        std::chrono::milliseconds(parseInteger("--watch-interval-ms", watchInterval, 1, 3600000));
    o.debugForwardDelay =
        std::chrono::milliseconds(parseInteger("--debug-forward-delay-ms", debugDelay, 0, 600000));
    // By default the cores are split between the workers, so that concurrent forwards do not
    // oversubscribe them.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    runtime.threads =
        torchThreads.empty()
            ? std::max(1, cores / static_cast<int>(o.workers))
            : static_cast<int>(parseInteger("--torch-threads", torchThreads, 1, 1024));
    runtime.mkldnn = !noMkldnn;
  } catch (const shoal::InvalidArgument& e) {
    fmt::print(stderr, "shoal-serve: error: {}\n", e.what());
    return 2;
  }
  shoal::setLogLevel(shoal::LogLevel::kInfo);
  try {
    return serve(std::move(o), runtime);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    fmt::print(stderr, "shoal-serve: {}\n", what.substr(0, what.find('\n')));
    return 1;
  }
}
