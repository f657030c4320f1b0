// What experiment tracking costs (track/): the time of one Tracker::log() call as the training
// loop sees it, how many points per second the writer gets into the file, and the overhead on an
// emulated training step. Results: bench/results/observability.md.
//
//   tracking_overhead [--points N] [--runs R] [--steps S] [--step-us U] [--dir DIR]
//
// Every figure is the median over R runs, each into a fresh store (flush interval 100 ms, so
// the writer appends while the loop logs):
// - log(), cold: N calls (cycling over 8 metric names, one longer than std::string's inline
//   buffer) into a new Tracker, whose buffers grow (and fault their pages in) as they fill.
// - log(), warm: N more calls into the same Tracker after a flush: buffers at their high-water
//   mark, the state of a Tracker after its first flush interval.
// - the writer: the warm N points' log + flush, end to end, in points/s.
// - the store alone: MetricsStore::append of batches of 4096 points.
// - a training loop: S steps of about U us of CPU work each, logging 10 metrics per step, against
//   the same loop without a Tracker (5 alternated slices of S/5 steps, the fastest slice of each
//   kept); the overhead in percent of the step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "track/metrics_store.h"
#include "track/tracker.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kNames[] = {
    "loss",         "accuracy",
    "lr",           "samples_per_s",
    "step_time_s",  "comm_time_s",
    "memory_bytes", "optimizer/grad_norm_before_clipping_by_layer_group"};

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Run {
  double coldNs = 0;            // log() per call, fresh buffers
  double warmNs = 0;            // log() per call, buffers at their high-water mark
  double writerPointsPerS = 0;  // log + flush, end to end
  double storePointsPerS = 0;   // MetricsStore::append alone
  double overheadPercent = 0;   // of an emulated training step
};

// About `iterations` dependent multiply-adds: a training step's computation, which the
// compiler cannot drop.
uint64_t work(uint64_t iterations, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < iterations; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}

void removeStore(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
}

double logBurst(shoal::track::Tracker& tracker, size_t points, size_t offset) {
  const auto t0 = Clock::now();
  for (size_t i = offset; i < offset + points; ++i) {
    tracker.log(kNames[i % 8], static_cast<int64_t>(i / 8), static_cast<double>(i));
  }
  return seconds(t0, Clock::now());
}

// Seconds for `steps` emulated steps, with 10 log() calls each when `tracker` is given.
double trainingLoop(shoal::track::Tracker* tracker, int steps, uint64_t iterations) {
  volatile uint64_t sink = 0;
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    sink = sink + work(iterations, static_cast<uint64_t>(step));
    if (tracker != nullptr) {
      for (int m = 0; m < 10; ++m) tracker->log(kNames[m % 8], step, static_cast<double>(sink));
    }
  }
  return seconds(t0, Clock::now());
}

Run runOnce(const std::string& dir, int index, size_t points, int steps, uint64_t iterations) {
  Run r;
  const std::string path = dir + "/tracking_bench" + std::to_string(index) + ".db";
  removeStore(path);
  {
    shoal::track::Tracker tracker({.path = path,
                                   .rank = 0,
                                   .flushInterval = std::chrono::milliseconds(100),
                                   .maxQueued = 2 * points});
    r.coldNs = logBurst(tracker, points, 0) * 1e9 / static_cast<double>(points);
    tracker.flush(std::chrono::minutes(5));
    const auto t0 = Clock::now();
    const double warm = logBurst(tracker, points, points);
    tracker.flush(std::chrono::minutes(5));
    r.warmNs = warm * 1e9 / static_cast<double>(points);
    r.writerPointsPerS = static_cast<double>(points) / seconds(t0, Clock::now());
    if (tracker.dropped() != 0 || tracker.written() != 2 * points) {
      std::fprintf(stderr, "error: %llu points dropped, %llu of %zu written\n",
                   static_cast<unsigned long long>(tracker.dropped()),
                   static_cast<unsigned long long>(tracker.written()), 2 * points);
      std::exit(1);
    }
  }
  removeStore(path);
  {
    shoal::track::MetricsStore store(path);
    std::vector<shoal::track::MetricPoint> batch(4096);
    const auto t0 = Clock::now();
    for (size_t done = 0; done < points; done += batch.size()) {
      const size_t n = std::min(batch.size(), points - done);
      for (size_t i = 0; i < n; ++i) {
        const size_t k = done + i;
        batch[i] = {kNames[k % 8], static_cast<int64_t>(k / 8), static_cast<double>(k), 0,
                    static_cast<int64_t>(k)};
      }
      store.append(0, std::span(batch.data(), n));
    }
    r.storePointsPerS = static_cast<double>(points) / seconds(t0, Clock::now());
  }
  removeStore(path);
  {
    shoal::track::Tracker tracker(
        {.path = path, .rank = 0, .flushInterval = std::chrono::milliseconds(100)});
    trainingLoop(&tracker, steps / 10, iterations);  // warm-up: buffers, caches
    // Alternated, and the fastest of each kept: other load on the machine only adds time.
    double plain = 1e300, tracked = 1e300;
    for (int i = 0; i < 5; ++i) {
      plain = std::min(plain, trainingLoop(nullptr, steps / 5, iterations));
      tracked = std::min(tracked, trainingLoop(&tracker, steps / 5, iterations));
    }
    r.overheadPercent = 100.0 * (tracked - plain) / plain;
  }
  removeStore(path);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  size_t points = 200000;
  int runs = 7;
  int steps = 2000;
  double stepUs = 1000;
  std::string dir = std::filesystem::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--points") {
      points = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (flag == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (flag == "--step-us") {
      stepUs = std::atof(argv[i + 1]);
    } else if (flag == "--dir") {
      dir = argv[i + 1];
    } else {
      std::fprintf(stderr,
                   "usage: tracking_overhead [--points N] [--runs R] [--steps S] [--step-us U] "
                   "[--dir DIR]\n");
      return 2;
    }
  }
  if (points == 0 || runs < 1 || steps < 10 || stepUs <= 0) {
    std::fprintf(stderr, "error: --points, --runs, --step-us positive, --steps at least 10\n");
    return 2;
  }
  // Calibrate the emulated step: iterations per microsecond of this machine.
  const auto c0 = Clock::now();
  volatile uint64_t sink = work(50'000'000, 1);
  (void)sink;
  const uint64_t iterations =
      static_cast<uint64_t>(stepUs * 50'000'000 / (seconds(c0, Clock::now()) * 1e6));

  std::vector<Run> results;
  try {
    for (int i = 0; i < runs; ++i) results.push_back(runOnce(dir, i, points, steps, iterations));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  auto row = [&](const char* label, double Run::*field, const char* format) {
    std::vector<double> v;
    for (const Run& r : results) v.push_back(r.*field);
    const std::string f =
        std::string("| %s | ") + format + " | " + format + " | " + format + " |\n";
    std::printf(f.c_str(), label, median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  };
  std::printf("%zu points per burst, %d steps of %.0f us, median of %d runs\n\n", points, steps,
              stepUs, runs);
  std::printf("| measure | median | min | max |\n|---|---:|---:|---:|\n");
  row("log() per call, cold buffers (ns)", &Run::coldNs, "%.1f");
  row("log() per call, warm buffers (ns)", &Run::warmNs, "%.1f");
  row("Tracker log + flush (points/s)", &Run::writerPointsPerS, "%.0f");
  row("MetricsStore::append, batches of 4096 (points/s)", &Run::storePointsPerS, "%.0f");
  row("training step with 10 log() calls: overhead (%)", &Run::overheadPercent, "%.3f");
  return 0;
}
