// consolidate() of train/reshard_checkpoint.h: one torch::save file from a sharded step.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train {

namespace {

// A module as torch::nn::Module::save writes it: its own parameters and buffers, then one
// nested archive per child.
struct ModuleNode {
  std::map<std::string, torch::Tensor> params;
  std::map<std::string, torch::Tensor> buffers;
  std::map<std::string, ModuleNode> children;

  bool hasLeaf(const std::string& k) const { return params.count(k) || buffers.count(k); }
};

void insert(ModuleNode& root, const std::string& fullName, const std::string& path,
            torch::Tensor value, bool buffer, const std::string& where) {
  ModuleNode* node = &root;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (part.empty()) {
      SHOAL_THROW(InvalidArgument, "consolidating {}: '{}' is not a module path (empty part)",
                  where, fullName);
    }
    if (dot == std::string::npos) {
      if (node->hasLeaf(part) || node->children.count(part)) {
        SHOAL_THROW(InvalidArgument,
                    "consolidating {}: '{}' clashes with another tensor or submodule of that name",
                    where, fullName);
      }
      (buffer ? node->buffers : node->params).emplace(part, std::move(value));
      return;
    }
    if (node->hasLeaf(part)) {
      SHOAL_THROW(InvalidArgument,
                  "consolidating {}: '{}' needs a submodule '{}' where a tensor of that name is",
                  where, fullName, part);
    }
    node = &node->children[part];
    start = dot + 1;
  }
}

void write(const ModuleNode& node, torch::serialize::OutputArchive& archive) {
  for (const auto& [k, t] : node.params) archive.write(k, t);
  for (const auto& [k, t] : node.buffers) archive.write(k, t, /*is_buffer=*/true);
  for (const auto& [k, child] : node.children) {
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    write(child, sub);
    archive.write(k, sub);
  }
}

}  // namespace

size_t consolidate(const std::string& dir, int64_t step, const std::string& outPath) {
  const ShardReader reader(dir, step);
  const std::string where = fmt::format("step {} of {}", step, dir);
  ModuleNode root;
  size_t count = 0;
  for (const auto& name : reader.names()) {
    // Clashes are checked before any clash-free leaf makes the file, so order does not matter.
    for (const char* prefix : {"param/", "buffer/"}) {
      const std::string p(prefix);
      if (name.rfind(p, 0) != 0) continue;
      insert(root, name, name.substr(p.size()), reader.readFull(name), p == "buffer/", where);
      ++count;
    }
  }
  const std::string tmp = outPath + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    write(root, archive);
    archive.save_to(tmp);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    const std::string what = e.what();
    SHOAL_THROW(SystemError, "consolidating {}: writing {} failed: {}", where, tmp,
                what.substr(0, what.find('\n')));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, outPath, ec);
  if (ec) {
    SHOAL_THROW(SystemError, "consolidating {}: renaming {} to {}: {}", where, tmp, outPath,
                ec.message());
  }
  return count;
}

}  // namespace shoal::train
