// Whole parameter-server jobs for the tests: shoal run --servers with tests/ps_worker.cpp, and
// what to read from their output. The including target defines SHOAL_BIN and SHOAL_PS_WORKER.
#pragma once

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace shoal::test {

inline RunResult psJob(const std::vector<std::string>& launch,
                       const std::vector<std::string>& program, const TempDir& dir,
                       std::chrono::seconds timeout = std::chrono::seconds(300)) {
  std::vector<std::string> args = launch;
  args.insert(args.end(), {"--timeout", "60", "--", SHOAL_PS_WORKER});
  args.insert(args.end(), program.begin(), program.end());
  return shoalRun(SHOAL_BIN, args, dir, timeout);
}

// Lines "[r] <text>" of the workers 0..n-1 that contain `what`.
inline int workersSaying(const std::string& output, int n, const std::string& what) {
  int count = 0;
  for (int r = 0; r < n; ++r) {
    std::regex line("\\[" + std::to_string(r) + "\\] [^\n]*" +
                    std::regex_replace(what, std::regex(R"([\[\]\(\)\.\*\+\?])"), R"(\$&)"));
    if (std::regex_search(output, line)) ++count;
  }
  return count;
}

// Worker 0's "final digest" (the train scenario), or empty.
inline std::string finalDigest(const std::string& output) {
  std::smatch m;
  std::regex d(R"(\[0\] final digest ([0-9a-f]+))");
  return std::regex_search(output, m, d) ? m[1].str() : "";
}

// The digest of an uninterrupted `train` job of 2 workers and 2 servers (the reference the
// interrupted ones must equal bit for bit), with `extra` flags for ps_worker; empty, with a test
// failure, if it did not run.
inline std::string uninterruptedTrainDigest(const std::vector<std::string>& extra = {}) {
  TempDir clean;
  std::vector<std::string> program{"train", "--dir", clean.path};
  program.insert(program.end(), extra.begin(), extra.end());
  auto whole = psJob({"-n", "2", "--servers", "2"}, program, clean);
  EXPECT_EQ(whole.code, 0) << whole.output;
  const std::string digest = finalDigest(whole.output);
  EXPECT_FALSE(digest.empty()) << whole.output;
  return digest;
}

}  // namespace shoal::test
