// A closed-loop HTTP load generator for shoal-serve and its naive peer (bench/run_serve.py).
//
//   shoal_serve_load HOST PORT [--clients 32] [--seconds 5] [--warmup 1]
//
// Each client thread keeps one keep-alive connection and sends one-instance predictions back to
// back (a random 784-float image, the same per client), timing each from send to answer.
// Requests finishing during the warm-up are not counted. Prints one JSON line: requests, errors,
// throughput (answers per second), p50/p99/max latency in milliseconds.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: shoal_serve_load HOST PORT [--clients N] [--seconds S] [--warmup S]\n");
    return 2;
  }
  const std::string host = argv[1];
  const int port = std::atoi(argv[2]);
  int clients = 32;
  double seconds = 5, warmup = 1;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--clients")
      clients = std::atoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (a == "--warmup")
      warmup = std::atof(argv[i + 1]);
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto measureFrom =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  const auto end = measureFrom + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(seconds));
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<long> errors{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(c);
      std::normal_distribution<float> normal;
      std::string body = "{\"inputs\":[";
      for (int i = 0; i < 784; ++i) {
        if (i > 0) body += ',';
        body += std::to_string(normal(rng));
      }
      body += "]}";
      httplib::Client cli(host, port);
      cli.set_keep_alive(true);
      cli.set_read_timeout(60, 0);
      for (;;) {
        const auto t0 = Clock::now();
        if (t0 >= end) break;
        auto r = cli.Post("/v1/predict", body, "application/json");
        const auto t1 = Clock::now();
        if (t1 < measureFrom) continue;
        if (!r || r->status != 200) {
          ++errors;
          continue;
        }
        if (t1 <= end)
          latencies[c].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  const auto q = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  std::printf(
      "{\"clients\": %d, \"requests\": %zu, \"errors\": %ld, \"throughput\": %.1f, "
      "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f}\n",
      clients, all.size(), errors.load(), all.size() / seconds, q(0.5), q(0.99),
      all.empty() ? 0.0 : all.back());
  return 0;
}
