// shoal-consolidate: one file for deployment from a sharded checkpoint
// (train/reshard_checkpoint.h).
//
//   shoal-consolidate <dir> [--step N] <out.pt>
//
// Writes every parameter and buffer of step N (default: the newest committed step) in
// torch::save format, loadable by torch::load(model, "out.pt") in one process. Prints one
// line; on any error, one line on stderr and exit code 1.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "train/reshard_checkpoint.h"

namespace {

constexpr const char* kUsage = "usage: shoal-consolidate <dir> [--step N] <out.pt>";

int run(int argc, char** argv) {
  std::vector<std::string> positional;
  std::optional<int64_t> step;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--step") {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "--step needs a value; {}", kUsage);
      step = shoal::parseInteger("--step", argv[++i], 0, INT64_MAX);
    } else if (arg == "-h" || arg == "--help") {
      std::printf("%s\n", kUsage);
      return 0;
    } else if (arg.rfind("--", 0) == 0) {
      SHOAL_THROW(InvalidArgument, "unknown option '{}'; {}", arg, kUsage);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) SHOAL_THROW(InvalidArgument, "{}", kUsage);
  const std::string& dir = positional[0];
  const std::string& out = positional[1];
  if (!std::filesystem::is_directory(dir)) {
    SHOAL_THROW(InvalidArgument, "{}: not a checkpoint folder (no such directory)", dir);
  }
  if (!step) step = shoal::train::ShardReader::latestStep(dir);
  if (!step) SHOAL_THROW(InvalidArgument, "{}: holds no committed checkpoint step", dir);
  const int world = shoal::train::ShardReader(dir, *step).worldSize();
  const size_t tensors = shoal::train::consolidate(dir, *step, out);
  const auto bytes = std::filesystem::file_size(out);
  std::printf("consolidated step %lld of %s (written by %d ranks): %zu tensors, %llu bytes -> %s\n",
              static_cast<long long>(*step), dir.c_str(), world, tensors,
              static_cast<unsigned long long>(bytes), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "shoal-consolidate: %s\n", what.substr(0, what.find('\n')).c_str());
    return 1;
  }
}
