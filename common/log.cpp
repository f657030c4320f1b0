#include "common/log.h"

#include <unistd.h>

#include <string>

namespace shoal {

namespace {
std::atomic<int>& levelStore() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kWarn)};
  return level;
}
constexpr std::string_view kNames[] = {"error", "warn", "info", "debug"};
}  // namespace

void setLogLevel(LogLevel level) {
  levelStore().store(static_cast<int>(level));
}
LogLevel logLevel() {
  return static_cast<LogLevel>(levelStore().load(std::memory_order_relaxed));
}

void logLine(LogLevel level, std::string_view line) {
  std::string out = fmt::format("shoal {}: {}\n", kNames[static_cast<int>(level)], line);
  // One write(2) so lines from several ranks sharing a terminal do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

}  // namespace shoal
