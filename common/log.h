// Minimal leveled logging to stderr, one line per call (atomic for lines under PIPE_BUF).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string_view>

namespace shoal {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// The level is process-wide by nature (stderr is); it is set once from the configuration.
void setLogLevel(LogLevel level);
LogLevel logLevel();
void logLine(LogLevel level, std::string_view line);

template <typename... Args>
void logAt(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(logLevel())) {
    logLine(level, fmt::format(f, std::forward<Args>(args)...));
  }
}

#define SHOAL_LOG_WARN(...) ::shoal::logAt(::shoal::LogLevel::kWarn, __VA_ARGS__)
#define SHOAL_LOG_INFO(...) ::shoal::logAt(::shoal::LogLevel::kInfo, __VA_ARGS__)
#define SHOAL_LOG_DEBUG(...) ::shoal::logAt(::shoal::LogLevel::kDebug, __VA_ARGS__)

}  // namespace shoal
