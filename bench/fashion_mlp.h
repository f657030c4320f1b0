// What the Fashion-MNIST training benchmarks on the emulated network share
// (bench/compression_train.cpp for DDP, bench/ps_compression_train.cpp for the parameter
// servers): the wide MLP, the clock and median helpers, and the bytes a host's link sent.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace shoal::bench {

using Clock = std::chrono::steady_clock;

// 784 - hidden - hidden - 10 with ReLUs (hidden 3072: 11.9 M parameters).
inline torch::nn::Sequential makeMlp(int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(784, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, 10));
}

inline double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes sent by this network namespace's interfaces but the loopback (/proc/net/dev): on the
// emulated network, what crossed this host's link, TCP/IP headers included.
inline uint64_t linkBytesSent() {
  std::ifstream f("/proc/net/dev");
  std::string line;
  uint64_t sum = 0;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "lo") continue;
    // 8 receive counters, then the transmitted bytes.
    std::istringstream fields(line.substr(colon + 1));
    uint64_t received[8] = {}, sent = 0;
    for (auto& r : received) fields >> r;
    if (fields >> sent) sum += sent;
  }
  return sum;
}

}  // namespace shoal::bench
