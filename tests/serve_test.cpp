// shoal-serve as users run it: a real process on port 0, its URL read from its stdout, answers
// compared with a direct forward of the same model in this process; bad input, a full queue,
// reload of a renamed-in file, health, metrics and a graceful stop. Every wait has a deadline.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/process_util.h"
#include "train/export/file_bytes.h"
#include "train/export/tensor_file.h"
#include "train/fashion_cnn.h"
#include "train/fashion_mlp.h"

namespace shoal::serve {
namespace {

using nlohmann::json;
using test::Proc;
using test::TempDir;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kPixels = 784;

// A FashionCnn with seeded weights and non-trivial BatchNorm statistics, in eval mode.
train::FashionCnn makeModel(int seed) {
  torch::manual_seed(seed);
  train::FashionCnn m;
  torch::NoGradGuard noGrad;
  for (auto& b : m->named_buffers()) {
    if (b.key().find("running_mean") != std::string::npos) b.value().normal_(0, 0.1);
    if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 1.5);
  }
  m->eval();
  return m;
}

torch::Tensor forward(train::FashionCnn& m, const torch::Tensor& x) {
  torch::NoGradGuard noGrad;
  return m->forward(x.reshape({-1, 1, 28, 28}));
}

json instancesJson(const torch::Tensor& x) {
  json rows = json::array();
  const torch::Tensor c = x.reshape({-1, kPixels}).contiguous();
  for (int64_t i = 0; i < c.size(0); ++i) {
    const float* p = c[i].data_ptr<float>();
    rows.push_back(std::vector<float>(p, p + kPixels));
  }
  return rows;
}

// Largest absolute difference between the JSON outputs and `expected` (instances × 10).
float maxDiff(const json& outputs, const torch::Tensor& expected) {
  float worst = 0;
  EXPECT_EQ(outputs.size(), static_cast<size_t>(expected.size(0)));
  for (int64_t i = 0; i < expected.size(0) && i < static_cast<int64_t>(outputs.size()); ++i) {
    for (int64_t c = 0; c < 10; ++c) {
      worst = std::max(worst, std::abs(outputs[i][c].get<float>() - expected[i][c].item<float>()));
    }
  }
  return worst;
}

// One shoal-serve process for a test.
class Server {
 public:
  // `program`: how the server is started (shoal-serve itself, or `shoal serve`).
  Server(const std::string& dir, const std::string& model, std::vector<std::string> extra,
         std::vector<std::string> program = {SHOAL_SERVE_BIN})
      : proc_(args(std::move(program), model, std::move(extra)), dir + "/serve.out") {
    const bool said = proc_.waitForOutput(
        [](const std::string& out) {
          return std::regex_search(out, std::regex("at http://[^ \n]+/\n"));
        },
        60s);
    std::smatch m;
    const std::string out = proc_.output();
    if (!said || !std::regex_search(out, m, std::regex("at http://([0-9.]+):([0-9]+)/"))) {
      ADD_FAILURE() << "shoal-serve did not say where it serves:\n" << out;
      return;
    }
    host_ = m[1];
    port_ = std::stoi(m[2]);
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>(host_, port_);
    c->set_read_timeout(60, 0);
    c->set_write_timeout(60, 0);
    c->set_connection_timeout(10, 0);
    return c;
  }
  // status and parsed body of a prediction.
  std::pair<int, json> predict(const std::string& body) const {
    auto r = client()->Post("/v1/predict", body, "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::string metrics() const {
    auto r = client()->Get("/metrics");
    return r ? r->body : "";
  }
  // The value of a metric line "NAME VALUE", or -1.
  double metric(const std::string& name) const {
    const std::string text = metrics();
    std::smatch m;
    if (!std::regex_search(
            text, m,
            std::regex("\n" + std::regex_replace(name, std::regex(R"([{}])"), R"(\$&)") +
                       " ([0-9.e+-]+)\n"))) {
      return -1;
    }
    return std::stod(m[1]);
  }
  // Polls `done` (every 10 ms, at most `timeout`): for states only visible from outside.
  static bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return done();
  }
  Proc& proc() { return proc_; }
  bool ok() const { return port_ > 0; }

 private:
  static std::vector<std::string> args(std::vector<std::string> program, const std::string& model,
                                       std::vector<std::string> extra) {
    std::vector<std::string> a = std::move(program);
    a.insert(a.end(), {model, "--port", "0", "--torch-threads", "1"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  Proc proc_;
  std::string host_;
  int port_ = 0;
};

// `clients` concurrent clients send `each` requests of one instance of `many` each: every answer
// must be its own instance's (`expected`, within 1e-5). A request that failed in the client's
// connection (seen once in CI, 1 of 160, under load; the server had not counted it) is sent
// again on a new connection, once; the error is noted, and more than 2 of them fail the test.
void expectEachAnswered(const Server& s, const torch::Tensor& many, const torch::Tensor& expected,
                        int clients, int each) {
  std::atomic<int> good{0};
  std::mutex failuresMu;
  std::vector<std::string> failures, retried;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto cli = s.client();
      for (int i = 0; i < each; ++i) {
        const int k = c * each + i;
        const std::string request = json{{"inputs", instancesJson(many[k])[0]}}.dump();
        auto r = cli->Post("/v1/predict", request, "application/json");
        if (!r) {
          std::lock_guard<std::mutex> lock(failuresMu);
          retried.push_back(httplib::to_string(r.error()));
          cli = s.client();
          r = cli->Post("/v1/predict", request, "application/json");
        }
        if (!r || r->status != 200) {
          std::lock_guard<std::mutex> lock(failuresMu);
          failures.push_back(r ? fmt::format("status {}", r->status)
                               : httplib::to_string(r.error()));
          continue;
        }
        if (maxDiff(json::parse(r->body)["outputs"], expected.slice(0, k, k + 1)) <= 1e-5) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), clients * each) << fmt::format("{}", fmt::join(failures, "; "));
  EXPECT_LE(retried.size(), 2u) << fmt::format("{}", fmt::join(retried, "; "));
  if (!retried.empty())
    std::printf("retried: %s\n", fmt::format("{}", fmt::join(retried, "; ")).c_str());
}

TEST(Serve, PredictionsMatchADirectForwardAndStopIsGraceful) {
  torch::set_num_threads(1);
  TempDir dir;
  auto model = makeModel(1);
  torch::save(model, dir.path + "/model.pt");
  Server s(dir.path, dir.path + "/model.pt", {"--workers", "2", "--batch-window-us", "20000"});
  ASSERT_TRUE(s.ok());

  auto health = s.client()->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["model_version"], 1);

  torch::manual_seed(99);
  const torch::Tensor x = torch::randn({3, kPixels});
  const torch::Tensor expected = forward(model, x);
  auto [status, body] = s.predict(json{{"inputs", instancesJson(x)}}.dump());
  ASSERT_EQ(status, 200) << body;
  EXPECT_LE(maxDiff(body["outputs"], expected), 1e-5);
  EXPECT_EQ(body["classes"][0], expected[0].argmax().item<int64_t>());
  // One instance, not in a list: answered as a batch of one.
  std::tie(status, body) = s.predict(json{{"inputs", instancesJson(x[1])[0]}}.dump());
  ASSERT_EQ(status, 200) << body;
  EXPECT_LE(maxDiff(body["outputs"], expected.slice(0, 1, 2)), 1e-5);

  // Concurrent clients, one instance each: every answer is its own instance's, and batches
  // formed (fewer forwards than requests).
  constexpr int kClients = 16, kEach = 10;
  const torch::Tensor many = torch::randn({kClients * kEach, kPixels});
  const torch::Tensor manyExpected = forward(model, many);
  expectEachAnswered(s, many, manyExpected, kClients, kEach);
  const double batches = s.metric("shoal_serve_batch_instances_count");
  const double served = s.metric("shoal_serve_batch_requests_total");
  EXPECT_EQ(served, kClients * kEach + 2);
  EXPECT_GT(batches, 0);
  EXPECT_LT(batches, served) << s.metrics();
  EXPECT_EQ(s.metric("shoal_serve_requests_total{route=\"predict\",code=\"200\"}"),
            kClients * kEach + 2);
  EXPECT_GT(s.metric("shoal_serve_request_seconds_count"), 0);

  ::kill(s.proc().pid(), SIGTERM);
  EXPECT_EQ(s.proc().wait(30s), 0) << s.proc().output();
  EXPECT_NE(s.proc().output().find("stopped on signal"), std::string::npos);
}

TEST(Serve, BadRequestsGetOneLineErrors) {
  TempDir dir;
  auto model = makeModel(2);
  train::writeTensorFile(dir.path + "/model.safetensors", train::moduleTensors(*model),
                         train::TensorFileFormat::kSafetensors);
  Server s(dir.path, dir.path + "/model.safetensors", {"--max-body", "50000", "--max-batch", "8"});
  ASSERT_TRUE(s.ok());
  const auto expectError = [&](const std::string& body, int code, const std::string& text) {
    auto [status, j] = s.predict(body);
    EXPECT_EQ(status, code) << body.substr(0, 80);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << body.substr(0, 80);
    EXPECT_NE(j["error"].get<std::string>().find(text), std::string::npos) << j;
  };
  expectError("this is not json", 400, "not JSON");
  expectError(R"({"inputs": [1, 2, 3]})", 400, "has 3 values; the model takes 784");
  expectError(json{{"inputs", std::vector<std::string>(kPixels, "a")}}.dump(), 400, "not a number");
  expectError(json{{"inputs", json::array({std::vector<float>(kPixels, 0.5f), "x"})}}.dump(), 400,
              "instance 1 is not an array");
  expectError(
      json{{"inputs", std::vector<std::vector<float>>(9, std::vector<float>(kPixels))}}.dump(), 400,
      "at most 8");
  expectError(std::string(60000, '['), 413, "larger than the 50000 bytes");
  expectError(R"({"outputs": []})", 400, "\"inputs\"");
  auto r = s.client()->Get("/v2/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body, R"({"error":"not found"})");
  // Still serving, and the safetensors file gave the model's exact weights.
  const torch::Tensor x = torch::randn({2, kPixels});
  auto [status, body] = s.predict(json{{"inputs", instancesJson(x)}}.dump());
  ASSERT_EQ(status, 200);
  EXPECT_LE(maxDiff(body["outputs"], forward(model, x)), 1e-5);
  EXPECT_EQ(s.metric("shoal_serve_requests_total{route=\"predict\",code=\"400\"}"), 6);
  EXPECT_EQ(s.metric("shoal_serve_requests_total{route=\"predict\",code=\"413\"}"), 1);
  EXPECT_EQ(s.metric("shoal_serve_requests_total{route=\"other\",code=\"404\"}"), 1);
}

TEST(Serve, AFullQueueAnswers503) {
  TempDir dir;
  auto model = makeModel(3);
  torch::save(model, dir.path + "/model.pt");
  // One worker, one instance per forward, each forward held 3 s, one request may wait.
  Server s(dir.path, dir.path + "/model.pt",
           {"--queue-limit", "1", "--max-batch", "1", "--workers", "1", "--debug-forward-delay-ms",
            "3000"});
  ASSERT_TRUE(s.ok());
  const std::string body = json{{"inputs", std::vector<float>(kPixels, 0.1f)}}.dump();
  int a = 0, b = 0;
  std::thread first([&] { a = s.predict(body).first; });
  // A is in the worker's forward (held), the queue empty...
  ASSERT_TRUE(Server::eventually(
      [&] {
        return s.metric("shoal_serve_batches_in_flight") == 1 &&
               s.metric("shoal_serve_queue_depth") == 0;
      },
      30s));
  std::thread second([&] { b = s.predict(body).first; });
  // ...B waits in the queue, which is then full...
  ASSERT_TRUE(Server::eventually([&] { return s.metric("shoal_serve_queue_depth") == 1; }, 30s));
  // ...so C is refused at once.
  const auto t0 = Clock::now();
  auto [status, j] = s.predict(body);
  EXPECT_EQ(status, 503) << j;
  EXPECT_NE(j["error"].get<std::string>().find("queue is full"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 2s);
  first.join();
  second.join();
  EXPECT_EQ(a, 200);
  EXPECT_EQ(b, 200);
  EXPECT_EQ(s.metric("shoal_serve_requests_total{route=\"predict\",code=\"503\"}"), 1);
}

TEST(Serve, ReloadsARenamedInModelAndKeepsTheOldOneOnABrokenFile) {
  torch::set_num_threads(1);
  TempDir dir;
  const std::string path = dir.path + "/model.pt";
  auto oldModel = makeModel(4);
  torch::save(oldModel, path);
  Server s(dir.path, path, {"--watch", "--watch-interval-ms", "100"});
  ASSERT_TRUE(s.ok());
  const torch::Tensor x = torch::randn({2, kPixels});
  const std::string body = json{{"inputs", instancesJson(x)}}.dump();
  auto [status, j] = s.predict(body);
  ASSERT_EQ(status, 200);
  EXPECT_LE(maxDiff(j["outputs"], forward(oldModel, x)), 1e-5);

  // A new model, written aside and renamed in (a pickled state_dict this time).
  auto newModel = makeModel(5);
  train::writeTensorFile(dir.path + "/next.pt", train::moduleTensors(*newModel),
                         train::TensorFileFormat::kPickleDict);
  std::filesystem::rename(dir.path + "/next.pt", path);
  ASSERT_TRUE(Server::eventually([&] { return s.metric("shoal_serve_model_version") == 2; }, 30s))
      << s.proc().output();
  std::tie(status, j) = s.predict(body);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(j["model_version"], 2);
  EXPECT_LE(maxDiff(j["outputs"], forward(newModel, x)), 1e-5);

  // A broken file: logged, counted, the model of version 2 stays.
  train::writeFileAtomically(dir.path + "/broken.pt", "PK\x03\x04 definitely not a model");
  std::filesystem::rename(dir.path + "/broken.pt", path);
  ASSERT_TRUE(Server::eventually(
      [&] { return s.metric("shoal_serve_model_reload_failures_total") == 1; }, 30s));
  std::tie(status, j) = s.predict(body);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(j["model_version"], 2);
  EXPECT_LE(maxDiff(j["outputs"], forward(newModel, x)), 1e-5);
  EXPECT_NE(s.proc().output().find("keeping model version 2"), std::string::npos);
}

// `shoal serve` is shoal-serve: the same answers, and the same one-line refusals and exit codes.
TEST(Serve, ShoalServeRunsTheServer) {
  torch::set_num_threads(1);
  TempDir dir;
  auto model = makeModel(3);
  torch::save(model, dir.path + "/model.pt");
  {
    Server s(dir.path, dir.path + "/model.pt", {}, {SHOAL_BIN, "serve"});
    ASSERT_TRUE(s.ok());
    torch::manual_seed(7);
    const torch::Tensor x = torch::randn({2, kPixels});
    auto [status, body] = s.predict(json{{"inputs", instancesJson(x)}}.dump());
    ASSERT_EQ(status, 200) << body;
    EXPECT_LE(maxDiff(body["outputs"], forward(model, x)), 1e-5);
    ::kill(s.proc().pid(), SIGTERM);
    EXPECT_EQ(s.proc().wait(30s), 0) << s.proc().output();
  }
  auto r = test::runShell(fmt::format("{} serve {}/model.pt --max-batch 0", SHOAL_BIN, dir.path));
  EXPECT_EQ(r.code, 2) << r.output;
  auto direct =
      test::runShell(fmt::format("{} {}/model.pt --max-batch 0", SHOAL_SERVE_BIN, dir.path));
  EXPECT_EQ(r.output, direct.output);
}

// The wide MLP (--model fashion_mlp, 20 M parameters) from each file format: answers equal a
// direct forward, alone, several per request and from concurrent clients (batched).
TEST(Serve, FashionMlpAnswersAsADirectForwardFromEveryFormat) {
  torch::set_num_threads(1);
  TempDir dir;
  torch::manual_seed(11);
  train::FashionMlp model;
  model->eval();
  torch::save(model, dir.path + "/mlp.pt");
  train::writeTensorFile(dir.path + "/mlp.safetensors", train::moduleTensors(*model),
                         train::TensorFileFormat::kSafetensors);
  train::writeTensorFile(dir.path + "/mlp_dict.pt", train::moduleTensors(*model),
                         train::TensorFileFormat::kPickleDict);
  const auto direct = [&](const torch::Tensor& x) {
    torch::NoGradGuard noGrad;
    return model->forward(x.reshape({-1, kPixels}));
  };
  torch::manual_seed(98);
  const torch::Tensor x = torch::randn({3, kPixels});
  const torch::Tensor expected = direct(x);
  for (const std::string file : {"mlp.pt", "mlp.safetensors", "mlp_dict.pt"}) {
    SCOPED_TRACE(file);
    Server s(dir.path, dir.path + "/" + file,
             {"--model", "fashion_mlp", "--workers", "2", "--batch-window-us", "20000"});
    ASSERT_TRUE(s.ok());
    auto health = s.client()->Get("/healthz");
    ASSERT_TRUE(health);
    EXPECT_EQ(json::parse(health->body)["model"], "fashion_mlp");
    auto [status, body] = s.predict(json{{"inputs", instancesJson(x)}}.dump());
    ASSERT_EQ(status, 200) << body;
    EXPECT_LE(maxDiff(body["outputs"], expected), 1e-5);
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(body["classes"][i], expected[i].argmax().item<int64_t>());
    if (file != "mlp.pt") continue;
    // Concurrent clients, one instance each: each gets its own instance's answer, in batches.
    constexpr int kClients = 8, kEach = 4;
    const torch::Tensor many = torch::randn({kClients * kEach, kPixels});
    const torch::Tensor manyExpected = direct(many);
    expectEachAnswered(s, many, manyExpected, kClients, kEach);
    EXPECT_LT(s.metric("shoal_serve_batch_instances_count"),
              s.metric("shoal_serve_batch_requests_total"))
        << s.metrics();
  }
}

// A file of another architecture, or of the MLP at another width, is refused at start in one
// line naming the misfit, exit code 1.
TEST(Serve, AFileOfAnotherArchitectureIsRefusedInOneLine) {
  TempDir dir;
  auto cnn = makeModel(7);
  torch::save(cnn, dir.path + "/cnn.pt");
  train::FashionMlp narrow(128);
  train::writeTensorFile(dir.path + "/narrow.safetensors", train::moduleTensors(*narrow),
                         train::TensorFileFormat::kSafetensors);
  train::FashionMlp mlp;
  train::writeTensorFile(dir.path + "/mlp.pt", train::moduleTensors(*mlp),
                         train::TensorFileFormat::kPickleDict);
  const auto expectRefusal = [&](const std::string& args, const std::string& text) {
    SCOPED_TRACE(args);
    auto r = test::runShell(fmt::format("{} {} --port 0", SHOAL_SERVE_BIN, args));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.rfind("shoal-serve: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(text), std::string::npos) << r.output;
  };
  expectRefusal(fmt::format("{}/cnn.pt --model fashion_mlp", dir.path),
                "holds 'bn1.bias', which the model has no tensor of that name for");
  expectRefusal(fmt::format("{}/mlp.pt --model fashion_cnn", dir.path),
                "holds 'fc3.bias', which the model has no tensor of that name for");
  expectRefusal(fmt::format("{}/mlp.pt", dir.path), "holds 'fc3.bias'");  // fashion_cnn default
  expectRefusal(fmt::format("{}/narrow.safetensors --model fashion_mlp", dir.path),
                "'fc1.bias' has shape [128], the model's has [4096]");
}

TEST(Serve, BadStartsFailWithOneLine) {
  TempDir dir;
  auto r = test::runShell(fmt::format("{} {}/missing.pt --port 0", SHOAL_SERVE_BIN, dir.path));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no such file"), std::string::npos) << r.output;
  auto model = makeModel(6);
  torch::save(model, dir.path + "/model.pt");
  r = test::runShell(
      fmt::format("{} {}/model.pt --port 0 --model resnet", SHOAL_SERVE_BIN, dir.path));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown model 'resnet' (known: fashion_cnn, fashion_mlp)"),
            std::string::npos);
  r = test::runShell(fmt::format("{} {}/model.pt --max-batch 0", SHOAL_SERVE_BIN, dir.path));
  EXPECT_EQ(r.code, 2) << r.output;
}

}  // namespace
}  // namespace shoal::serve
