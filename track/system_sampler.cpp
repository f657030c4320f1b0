#include "track/system_sampler.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/log.h"

namespace shoal::track {

namespace {

std::string readSmallFile(const char* path) {
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) throwSystemError(std::string("read ") + path, errno);
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err != 0) throwSystemError(std::string("read ") + path, err);
  return std::string(buf, n);
}

}  // namespace

ProcessStats readProcessStats() {
  static const long kTicks = ::sysconf(_SC_CLK_TCK);
  static const long kPage = ::sysconf(_SC_PAGESIZE);
  ProcessStats out;

  // Fields after the command name, which is in parentheses and may itself hold spaces and ')':
  // the last ')' ends it. utime and stime are fields 14 and 15 of the line, so the 12th and
  // 13th after the name.
  const std::string stat = readSmallFile("/proc/self/stat");
  const size_t close = stat.rfind(')');
  unsigned long long utime = 0, stime = 0;
  if (close == std::string::npos ||
      std::sscanf(stat.c_str() + close + 1,
                  " %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &utime, &stime) != 2) {
    SHOAL_THROW(SystemError, "read /proc/self/stat: unexpected format");
  }
  out.cpuSeconds = static_cast<double>(utime + stime) / static_cast<double>(kTicks);

  unsigned long long size = 0, resident = 0;
  if (std::sscanf(readSmallFile("/proc/self/statm").c_str(), "%llu %llu", &size, &resident) != 2) {
    SHOAL_THROW(SystemError, "read /proc/self/statm: unexpected format");
  }
  out.rssBytes = resident * static_cast<uint64_t>(kPage);
  return out;
}

SystemSampler::SystemSampler(Tracker& tracker, SystemSamplerOptions options)
    : tracker_(tracker), options_(options) {
  SHOAL_CHECK(options_.interval.count() > 0, "SystemSampler interval must be positive");
  // The baseline of the first interval's CPU time; also shows now that /proc can be read.
  last_ = readProcessStats();
  lastAt_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { run(); });
}

SystemSampler::~SystemSampler() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

uint64_t SystemSampler::samples() const {
  std::lock_guard lock(mutex_);
  return samples_;
}

bool SystemSampler::waitForSamples(uint64_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return samples_ >= n || failed_ || stop_; });
  return samples_ >= n;
}

void SystemSampler::run() {
  std::unique_lock lock(mutex_);
  auto next = lastAt_ + options_.interval;
  for (;;) {
    if (changed_.wait_until(lock, next, [&] { return stop_; })) return;
    lock.unlock();
    bool ok = true;
    try {
      const ProcessStats now = readProcessStats();
      const auto at = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(at - lastAt_).count();
      const double cpuPercent =
          seconds > 0 ? 100.0 * (now.cpuSeconds - last_.cpuSeconds) / seconds : 0.0;
      const int64_t step = std::max<int64_t>(tracker_.lastStep(), 0);
      tracker_.log("sys/cpu_percent", step, cpuPercent);
      tracker_.log("sys/rss_bytes", step, static_cast<double>(now.rssBytes));
      last_ = now;
      lastAt_ = at;
    } catch (const std::exception& e) {
      SHOAL_LOG_WARN("metrics of rank {}: system sampling stopped: {}", tracker_.rank(), e.what());
      ok = false;
    }
    lock.lock();
    if (!ok) {
      failed_ = true;
      changed_.notify_all();
      return;
    }
    ++samples_;
    changed_.notify_all();
    // On schedule, but never a burst of catch-up samples after a stall.
    next += options_.interval;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now + options_.interval;
  }
}

}  // namespace shoal::track
