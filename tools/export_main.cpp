// shoal-export: a trained model's tensors in files other frameworks load
// (train/export/tensor_file.h).
//
//   shoal-export <in> <out> [--format pt|safetensors] [--step N]
//
// <in> is a torch::save file of a module (or a file this tool wrote), a full model state as a
// trainer's --save writes it (train/full_state.h: the consolidated model of any strategy,
// pipeline stages and tensor-parallel slices gathered), or a sharded checkpoint folder (its
// newest committed step, or --step N). <out> gets every parameter and buffer by its
// state_dict name: "pt" is a pickled dict Python's plain torch.load(path) returns, "safetensors"
// the Hugging Face format. The format defaults from <out>'s extension (.safetensors, else pt).
// Prints one line; on any error, one line on stderr and exit code 1 (2 for bad usage).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "train/export/tensor_file.h"

namespace {

constexpr const char* kUsage =
    "usage: shoal-export <in.pt|full-state|checkpoint-dir> <out> [--format pt|safetensors] "
    "[--step N]";

int run(int argc, char** argv) {
  using namespace shoal::train;
  std::vector<std::string> positional;
  std::optional<int64_t> step;
  std::optional<TensorFileFormat> format;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--step" || arg == "--format") {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "{} needs a value; {}", arg, kUsage);
      if (arg == "--step")
        step = shoal::parseInteger("--step", argv[++i], 0, INT64_MAX);
      else
        format = tensorFileFormatFromName(argv[++i]);
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
  const std::string& in = positional[0];
  const std::string& out = positional[1];
  if (!format) {
    format = std::filesystem::path(out).extension() == ".safetensors"
                 ? TensorFileFormat::kSafetensors
                 : TensorFileFormat::kPickleDict;
  }
  const bool folder = std::filesystem::is_directory(in);
  if (!folder && step) SHOAL_THROW(InvalidArgument, "--step applies to a checkpoint folder only");
  const NamedTensors tensors = folder ? readCheckpointFolder(in, step) : readTensorFile(in);
  writeTensorFile(out, tensors, *format);
  std::printf("exported %zu tensors of %s -> %s (%s, %llu bytes)\n", tensors.size(), in.c_str(),
              out.c_str(), tensorFileFormatName(*format),
              static_cast<unsigned long long>(std::filesystem::file_size(out)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "shoal-export: %s\n", what.substr(0, what.find('\n')).c_str());
    return dynamic_cast<const shoal::InvalidArgument*>(&e) &&
                   what.find("usage") != std::string::npos
               ? 2
               : 1;
  }
}
