// One rank of the tracking tests (tests/tracking_test.cpp): logs `--steps` steps of `--metrics`
// metrics into one metrics store, with CPU work between steps standing in for training.
//
// Values are exact in a double, so the test can check every point it reads back:
//   value(rank, step, metric) = rank * 1e7 + step * 8 + metric + 0.25
//
// --kill-after N: log N steps, flush, print "flushed <points>", then keep logging (the writer
// busy in the background) and SIGKILL itself halfway through the remaining steps: a rank that
// dies without unwinding, maybe in the middle of a transaction.
//
// Exit: 0 after a clean run ("done <points>"), 1 on an error ("ERROR <Type>: <message>").
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/process_util.h"
#include "track/system_sampler.h"
#include "track/tracker.h"

namespace {

constexpr const char* kMetricNames[] = {"loss",          "accuracy",    "lr",
                                        "samples_per_s", "step_time_s", "comm_time_s"};

double valueOf(int rank, int64_t step, int metric) {
  return rank * 1e7 + static_cast<double>(step) * 8 + metric + 0.25;
}

// A stand-in for a training step's computation: integer mixing the compiler cannot drop.
uint64_t work(uint64_t iterations, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < iterations; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  std::string db;
  int rank = 0;
  int64_t steps = 2000;
  int metrics = 4;
  uint64_t workIterations = 2000;
  int flushMs = 20;
  int samplerMs = 0;
  int64_t killAfter = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--db") {
      db = v;
    } else if (flag == "--rank") {
      rank = std::atoi(v);
    } else if (flag == "--steps") {
      steps = std::atoll(v);
    } else if (flag == "--metrics") {
      metrics = std::atoi(v);
    } else if (flag == "--work") {
      workIterations = std::strtoull(v, nullptr, 10);
    } else if (flag == "--flush-ms") {
      flushMs = std::atoi(v);
    } else if (flag == "--sampler-ms") {
      samplerMs = std::atoi(v);
    } else if (flag == "--kill-after") {
      killAfter = std::atoll(v);
    } else {
      std::fprintf(stderr, "ERROR InvalidArgument: unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  if (metrics < 1 || metrics > 6) {
    std::fprintf(stderr, "ERROR InvalidArgument: --metrics must be 1 to 6\n");
    return 1;
  }
  try {
    shoal::track::Tracker tracker({.path = db,
                                   .rank = rank,
                                   .flushInterval = std::chrono::milliseconds(flushMs),
                                   .maxQueued = size_t{1} << 20});
    std::unique_ptr<shoal::track::SystemSampler> sampler;
    if (samplerMs > 0) {
      sampler = std::make_unique<shoal::track::SystemSampler>(
          tracker, shoal::track::SystemSamplerOptions{std::chrono::milliseconds(samplerMs)});
    }
    volatile uint64_t sink = 0;
    const int64_t killAt = killAfter >= 0 ? killAfter + (steps - killAfter) / 2 : -1;
    for (int64_t step = 0; step < steps; ++step) {
      if (step == killAt) std::raise(SIGKILL);
      sink = sink + work(workIterations, static_cast<uint64_t>(step));
      for (int m = 0; m < metrics; ++m) {
        if (!tracker.log(kMetricNames[m], step, valueOf(rank, step, m))) {
          std::fprintf(stderr, "ERROR Error: point dropped at step %lld\n",
                       static_cast<long long>(step));
          return 1;
        }
      }
      if (step + 1 == killAfter) {
        // Counted before flush(): the sampler's thread may log more meanwhile.
        const uint64_t logged = tracker.logged();
        tracker.flush();
        std::printf("flushed %llu\n", static_cast<unsigned long long>(logged));
        std::fflush(stdout);
      }
    }
    // At least one system sample per rank, so the test can check every rank's.
    if (sampler && !sampler->waitForSamples(1, std::chrono::seconds(30))) {
      std::fprintf(stderr, "ERROR TimeoutError: no system sample within 30 s\n");
      return 1;
    }
    sampler.reset();
    tracker.flush();
    std::printf("done %llu\n", static_cast<unsigned long long>(tracker.logged()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR %s: %s\n", shoal::test::typeName(e), e.what());
    return 1;
  }
  return 0;
}
