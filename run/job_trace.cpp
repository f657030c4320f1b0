#include "run/job_trace.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "common/error.h"
#include "run/trace_merge.h"

namespace shoal::run {

std::string traceRanksDir(const std::string& tracePath) {
  return std::filesystem::absolute(tracePath).string() + ".ranks";
}

void prepareTraceRanksDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "--trace: cannot create '{}': {}", dir, ec.message());
  for (const auto& file : rankTraceFiles(dir)) std::filesystem::remove(file, ec);
}

void mergeJobTrace(const std::string& tracePath, int expectedRanks) noexcept {
  std::string line;
  try {
    TraceMergeOptions mo;
    mo.expectedRanks = expectedRanks;
    line = describe(mergeTraceDir(traceRanksDir(tracePath), tracePath, mo), tracePath);
  } catch (const std::exception& e) {
    line = fmt::format("trace: {}", e.what());
  }
  line = "shoal run: " + line + "\n";
  [[maybe_unused]] ssize_t w = ::write(2, line.data(), line.size());
}

}  // namespace shoal::run
