// Shared measurement loop for the all-reduce benchmarks (Shoal, OpenMPI, Gloo), so that all
// three are timed the same way, in the style of nccl-tests:
// - sizes 4 KiB .. 256 MiB of float32, sum;
// - per size: warm-up, then `reps` repetitions; each repetition times `iters` back-to-back
//   all-reduces after a barrier and takes the slowest rank's time (a max-reduction);
// - reported: median latency over repetitions, algbw = bytes / time, busbw = algbw * 2(n-1)/n.
// Rank 0 prints one JSON line per size to stdout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shoal::bench {

struct Collective {
  std::function<void(float* data, size_t count)> allreduce;
  std::function<double(double)> maxOverRanks;
  std::function<void()> barrier;
};

inline std::vector<size_t> defaultSizes(size_t maxBytes = 256u << 20) {
  std::vector<size_t> s;
  for (size_t b = 4096; b <= maxBytes; b *= 4) s.push_back(b);
  return s;
}

// Enough back-to-back calls that a repetition lasts milliseconds, not microseconds.
inline int itersFor(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((16u << 20) / bytes, 1, 2000));
}

inline void runSizes(const std::string& impl, const std::string& variant, int rank, int n,
                     const Collective& c, const std::vector<size_t>& sizes, int reps) {
  std::vector<float> buf((sizes.back() + 3) / 4, 1.0f);
  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    const int iters = itersFor(bytes);
    for (int w = 0; w < std::min(iters, 20); ++w) c.allreduce(buf.data(), count);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      c.barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c.allreduce(buf.data(), count);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      times.push_back(c.maxOverRanks(t / iters));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double algbw = bytes / median / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (rank == 0) {
      nlohmann::json row = {{"impl", impl},
                            {"variant", variant},
                            {"n", n},
                            {"bytes", bytes},
                            {"reps", reps},
                            {"iters", iters},
                            {"median_us", median * 1e6},
                            {"min_us", times[0] * 1e6},
                            {"algbw", algbw},
                            {"busbw", busbw}};
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace shoal::bench
