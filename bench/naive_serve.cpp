// The peer of shoal-serve in bench/run_serve.py: the naive server, one request → one forward,
// run on the HTTP thread that read the request (as a Flask or plain-threaded server would).
// Same model loading, same request JSON, same HTTP library; no queue, no batching.
//
//   shoal_naive_serve MODEL_FILE [--model fashion_cnn|fashion_mlp] [--http-threads 64]
//                     [--torch-threads 1] [--mkldnn on|off]
//
// Prints "naive-serve: serving at http://127.0.0.1:PORT/" (a free port), serves until killed.
#include <httplib.h>
#include <torch/torch.h>

#include <cstdio>

#include "tools/serve/predict_request.h"
#include "train/export/served_model.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: shoal_naive_serve MODEL_FILE [--model NAME] [--http-threads N] "
                 "[--torch-threads N] [--mkldnn on|off]\n");
    return 2;
  }
  int httpThreads = 64;
  std::string modelName = "fashion_cnn";  // as shoal-serve's --model
  shoal::serve::TorchRuntime runtime;     // 1 thread: the HTTP threads run forwards side by side
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      modelName = argv[i + 1];
    else if (a == "--http-threads")
      httpThreads = std::atoi(argv[i + 1]);
    else if (a == "--torch-threads")
      runtime.threads = std::atoi(argv[i + 1]);
    else if (a == "--mkldnn")
      runtime.mkldnn = std::string(argv[i + 1]) != "off";
  }
  // The same runtime settings as shoal-serve (train/export/served_model.h): without them the
  // peer would lose to OpenBLAS's thread pool, not to batching.
  shoal::serve::configureTorchRuntime(runtime);
  std::shared_ptr<const shoal::serve::ServedModel> model;
  try {
    model = shoal::serve::ServedModel::load(modelName, argv[1], 1);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "naive-serve: %s\n", what.substr(0, what.find('\n')).c_str());
    return 1;
  }
  httplib::Server server;
  server.set_keep_alive_max_count(1000);
  server.set_tcp_nodelay(true);  // as shoal-serve: see predict_server.cpp
  server.new_task_queue = [httpThreads] { return new httplib::ThreadPool(httpThreads); };
  server.Post("/v1/predict", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      const auto in = shoal::serve::parsePredictRequest(req.body, model->instanceSize(), 64);
      const auto out = model->forward(in.values.data(), in.instances);
      res.set_content(
          shoal::serve::formatPredictResponse(out.data(), in.instances, model->classes(), 1),
          "application/json");
    } catch (const std::exception& e) {
      res.status = 400;
      res.set_content(shoal::serve::errorJson(e.what()), "application/json");
    }
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::printf("naive-serve: serving at http://127.0.0.1:%d/\n", port);
  std::fflush(stdout);
  server.listen_after_bind();
  return 0;
}
