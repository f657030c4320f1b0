// The machine's memcpy bandwidth on large buffers: the physical limit for moving bytes
// between ranks on one host. Prints one JSON line: median GB/s of one thread, and of two
// threads copying at once (the aggregate).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {
double copyGBs(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(bytes / t / 1e9);
    std::swap(a, b);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}
}  // namespace

int main() {
  const size_t bytes = 256u << 20;
  double one = copyGBs(bytes, 9);
  double two[2];
  std::thread t([&] { two[1] = copyGBs(bytes, 9); });
  two[0] = copyGBs(bytes, 9);
  t.join();
  std::printf(
      "{\"impl\": \"memcpy\", \"bytes\": %zu, \"one_thread_gbs\": %.3f, "
      "\"two_threads_gbs\": %.3f}\n",
      bytes, one, two[0] + two[1]);
  return 0;
}
