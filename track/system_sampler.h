// System metrics of this process, sampled into a Tracker every interval:
//   sys/cpu_percent  CPU time (user + system, all threads) over the last interval, as a percent
//                    of one core (200 = two cores busy)
//   sys/rss_bytes    resident memory now
// read from /proc/self/stat and /proc/self/statm (Linux). Each sample's step is the tracker's
// lastStep() (0 before any point), so system metrics line up with the training steps.
//
// Threading: a background thread owned by the sampler waits on a condition variable with the
// interval as timeout, so the destructor stops it at once (it does not wait out an interval).
// The Tracker must outlive the sampler.
//
// Errors: the constructor throws InvalidArgument for a non-positive interval and SystemError if
// /proc/self cannot be read. The thread never lets an exception out: if the tracker throws (its
// writer failed) or /proc cannot be read, it logs one warning and stops sampling; the tracker's
// owner sees the tracker's error on its own next log() or flush().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "track/tracker.h"

namespace shoal::track {

// What /proc says about this process now.
struct ProcessStats {
  double cpuSeconds = 0;  // user + system time so far, all threads
  uint64_t rssBytes = 0;  // resident set size
};

// Reads /proc/self/stat and /proc/self/statm. SystemError naming the file if it cannot.
ProcessStats readProcessStats();

struct SystemSamplerOptions {
  std::chrono::milliseconds interval{5000};
};

class SystemSampler {
 public:
  SystemSampler(Tracker& tracker, SystemSamplerOptions options = {});
  // Stops the thread promptly (no wait for the interval to end). Never throws.
  ~SystemSampler();
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  // Samples taken (logged into the tracker) so far.
  uint64_t samples() const;
  // Blocks until at least `n` samples were taken (true) or the timeout passes or sampling
  // stopped on an error (false).
  bool waitForSamples(uint64_t n, std::chrono::milliseconds timeout) const;

 private:
  void run();

  Tracker& tracker_;
  const SystemSamplerOptions options_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;  // stop requests and new samples
  uint64_t samples_ = 0;
  bool stop_ = false;
  bool failed_ = false;
  ProcessStats last_;
  std::chrono::steady_clock::time_point lastAt_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace shoal::track
