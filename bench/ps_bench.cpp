// Parameter-server push/pull throughput, and the limits it is measured against.
//
//   shoal run -n W --servers S -- ps_bench --bytes B [--steps R]
//       workers push-pull B bytes (the whole model, split over the servers) R times in
//       synchronous mode; worker 0 prints one JSON line: the median step time and the aggregate
//       GB/s (W x 2B per step: every worker's push and pull). --compression SPEC (none, fp16,
//       bf16, topk:D, onebit) and --pull-half set ps::ClientOptions; the line then also gives
//       the payload bytes worker 0 pushed and pulled per step (ps::Client::traffic()).
//       --optimizer sgd|adam|rmsprop: what the servers apply (default sgd, lr 1e-6).
//   ps_bench limits --bytes B
//       one JSON line: memcpy of B bytes into a shared-memory mapping (the copy every
//       shared-memory transfer makes), and one B-byte transfer over loopback TCP.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "ps/client.h"
#include "ps/server.h"
#include "run/init.h"

using namespace shoal;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double shmCopySeconds(size_t bytes) {
  int fd = ::memfd_create("ps-bench", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throwSystemError("memfd", errno);
  void* dst = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  std::vector<char> src(bytes, 1);
  std::memset(dst, 0, bytes);
  std::vector<double> t;
  for (int r = 0; r < 15; ++r) {
    auto t0 = Clock::now();
    std::memcpy(dst, src.data(), bytes);
    t.push_back(seconds(t0));
  }
  ::munmap(dst, bytes);
  ::close(fd);
  return median(t);
}

double tcpSeconds(size_t bytes) {
  int lst = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(lst, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::listen(lst, 1);
  ::getsockname(lst, reinterpret_cast<sockaddr*>(&a), &len);
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    throwSystemError("connect", errno);
  int s = ::accept(lst, nullptr, nullptr);
  std::vector<char> out(bytes, 1), in(bytes);
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    auto t0 = Clock::now();
    std::thread reader([&] {
      size_t got = 0;
      while (got < bytes) {
        ssize_t k = ::recv(s, in.data() + got, bytes - got, 0);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
    });
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t k = ::send(c, out.data() + sent, std::min<size_t>(bytes - sent, 4 << 20), 0);
      if (k <= 0) break;
      sent += static_cast<size_t>(k);
    }
    reader.join();
    t.push_back(seconds(t0));
  }
  ::close(c);
  ::close(s);
  ::close(lst);
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    size_t bytes = 4 << 20;
    int steps = 20;
    bool limits = false;
    ps::ClientOptions options;
    OptimizerKind optimizer = OptimizerKind::kSgd;
    for (int i = 1; i < argc; ++i) {
      std::string f = argv[i];
      if (f == "limits")
        limits = true;
      else if (f == "--bytes" && i + 1 < argc)
        bytes = std::stoull(argv[++i]);
      else if (f == "--steps" && i + 1 < argc)
        steps = std::stoi(argv[++i]);
      else if (f == "--compression" && i + 1 < argc)
        options.compression = compress::CompressionSpec::parse(argv[++i]);
      else if (f == "--optimizer" && i + 1 < argc)
        optimizer = parseOptimizer(argv[++i]);
      else if (f == "--pull-half")
        options.pullHalf = true;
      else
        SHOAL_THROW(InvalidArgument, "unknown argument {}", f);
    }
    if (limits) {
      const double copy = shmCopySeconds(bytes), tcp = tcpSeconds(bytes);
      std::printf(
          "{\"kind\": \"limits\", \"bytes\": %zu, \"shm_copy_GBps\": %.3f, "
          "\"tcp_GBps\": %.3f}\n",
          bytes, bytes / copy / 1e9, bytes / tcp / 1e9);
      return 0;
    }
    World w = init();
    const int workers = w.size - w.numServers;
    options.replicas = w.psReplicas;  // shoal run --ps-replicas 2: the cost of a second copy
    if (w.role == run::Role::kServer) {
      ps::ServerOptions o;
      o.quiet = true;
      o.replicas = w.psReplicas;
      ps::serve(*w.group, w.roleRank, w.numServers, workers, o);
      return 0;
    }
    const size_t n = bytes / sizeof(float);
    ps::TrainingConfig config;
    config.optimizer = {optimizer, 1e-6, 0, 0};
    ps::Client c(*w.group, w.roleRank, workers, w.numServers, {{"model", {int64_t(n)}}}, config,
                 options);
    // Gradient-like values (a spread of magnitudes, both signs): a constant gradient would make
    // top-k's selection all ties, which no model's gradients are.
    std::vector<float> values(n, 0.0f), grads(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
      grads[i] = static_cast<float>(static_cast<int>(h >> 16) - 32768) / 32768.0f;
    }
    if (c.mustInitialize()) c.initialize(values.data());
    c.pull(values.data(), 0)->wait();
    std::vector<double> t;
    const int warmup = 3;
    Clock::time_point start;
    ps::Traffic before;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        start = Clock::now();
        before = c.traffic();
      }
      auto t0 = Clock::now();
      c.pushPull(grads.data(), values.data(), s)->wait();
      if (s >= warmup) t.push_back(seconds(t0));
    }
    const double wall = seconds(start);
    const ps::Traffic after = c.traffic();
    c.finish();
    if (w.roleRank == 0) {
      const double step = median(t);
      std::printf(
          "{\"kind\": \"pushpull\", \"servers\": %d, \"workers\": %d, \"bytes\": %zu, "
          "\"step_ms_median\": %.3f, \"single_GBps\": %.3f, \"aggregate_GBps\": %.3f, "
          "\"compression\": \"%s\", \"pull_half\": %s, \"pushed_bytes_per_step\": %.0f, "
          "\"pulled_bytes_per_step\": %.0f, \"optimizer\": \"%s\"}\n",
          w.numServers, workers, bytes, step * 1e3, 2.0 * bytes / step / 1e9,
          2.0 * bytes * workers * steps / wall / 1e9, options.compression.toString().c_str(),
          options.pullHalf ? "true" : "false",
          static_cast<double>(after.pushedBytes - before.pushedBytes) / steps,
          static_cast<double>(after.pulledBytes - before.pulledBytes) / steps,
          std::string(toString(optimizer)).c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_bench: %s\n", e.what());
    return 1;
  }
}
