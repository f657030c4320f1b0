// The floor under a shared-memory ping-pong on this machine: what the 8 B latency in
// bench/results/p2p.md is compared with. Two threads, no Shoal above the ring:
// - `line`: one cache line each way, each thread spinning on the other's counter;
// - `ring`: 56-byte records (a frame header and 8 bytes) through two transport::shm rings, each
//   side spinning on the stamp of the next record (RingReader::emptyWatch).
// Prints one JSON line per measurement: the median one-way time of --reps runs, in ns. The
// threads are not pinned, like the ranks of the benchmarks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/shm/doorbell.h"
#include "transport/shm/ring.h"

namespace {

using namespace shoal::transport::shm;

constexpr int kRoundTrips = 1'000'000;

double linePingPong() {
  struct alignas(64) Line {
    std::atomic<uint64_t> v{0};
  };
  Line a, b;
  std::thread peer([&] {
    for (uint64_t i = 1; i <= kRoundTrips; ++i) {
      while (a.v.load(std::memory_order_acquire) != i) cpuRelax();
      b.v.store(i, std::memory_order_release);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 1; i <= kRoundTrips; ++i) {
    a.v.store(i, std::memory_order_release);
    while (b.v.load(std::memory_order_acquire) != i) cpuRelax();
  }
  const auto end = std::chrono::steady_clock::now();
  peer.join();
  return std::chrono::duration<double, std::nano>(end - start).count() / kRoundTrips / 2;
}

// Reads one 56-byte message, spinning on the next record's stamp while there is none.
void receive(RingReader& in, uint8_t* message) {
  size_t got = 0;
  bool wake = false;
  while (got < 56) {
    if (const std::atomic<uint64_t>* stamp = in.emptyWatch()) {
      while (stamp->load(std::memory_order_acquire) == 0) cpuRelax();
    }
    got += in.read(message + got, 56 - got, wake);
  }
}

double ringPingPong() {
  const size_t capacity = 4 << 20;
  LocalRingMemory there(capacity), back(capacity);
  std::thread peer([&] {
    RingReader in(there.data(), capacity);
    RingWriter out(back.data(), capacity);
    uint8_t message[56];
    for (int i = 0; i < kRoundTrips; ++i) {
      receive(in, message);
      iovec v{message, sizeof message};
      while (out.write(&v, 1, sizeof message) == 0) cpuRelax();
    }
  });
  RingWriter out(there.data(), capacity);
  RingReader in(back.data(), capacity);
  uint8_t message[56] = {1};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRoundTrips; ++i) {
    iovec v{message, sizeof message};
    while (out.write(&v, 1, sizeof message) == 0) cpuRelax();
    receive(in, message);
  }
  const auto end = std::chrono::steady_clock::now();
  peer.join();
  return std::chrono::duration<double, std::nano>(end - start).count() / kRoundTrips / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  if (reps < 1 || reps > 1000) {
    std::fprintf(stderr, "usage: ring_floor [reps, 1-1000]\n");
    return 2;
  }
  for (const std::string what : {"line", "ring"}) {
    std::vector<double> ns;
    for (int r = 0; r < reps; ++r) ns.push_back(what == "line" ? linePingPong() : ringPingPong());
    std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
    std::printf("{\"what\":\"%s\",\"one_way_ns\":%.1f,\"reps\":%d}\n", what.c_str(),
                ns[ns.size() / 2], reps);
  }
  return 0;
}
