#include "train/sharded_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"

namespace shoal::train {

namespace {

// The step a checkpoint file holds, from its name "ckpt-<8 digits>.pt".
int64_t stepOf(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  SHOAL_ASSERT(name.size() > 8 && name.rfind("ckpt-", 0) == 0, "checkpoint name '{}'", name);
  return std::stoll(name.substr(5));
}

// What a rank reports of its shard's newest checkpoint.
constexpr int64_t kNone = -1;     // no checkpoint yet
constexpr int64_t kCorrupt = -2;  // the newest is damaged
constexpr int64_t kNotMine = -3;  // another replica of the shard reads it

}  // namespace

std::optional<std::string> readLayout(const std::string& dir) {
  const std::string path = dir + "/layout";
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::string layout = readSealedFile(path);
  while (!layout.empty() && layout.back() == '\n') layout.pop_back();
  return layout;
}

ShardedCheckpointer::ShardedCheckpointer(std::string dir, int keep, ShardPlace place,
                                         torch::nn::Module& module)
    : dir_(std::move(dir)),
      place_(std::move(place)),
      module_(module),
      shard_(fmt::format("{}/{}", dir_, place_.shard), keep) {
  SHOAL_CHECK(place_.world && place_.replicas, "sharded checkpoint: no groups");
}

std::string ShardedCheckpointer::save(torch::optim::Optimizer& opt, const Progress& progress) {
  if (place_.world->rank() == 0) writeSealedFile(dir_ + "/layout", place_.layout + "\n");
  return shard_.save(*place_.replicas, module_, opt, progress);
}

std::optional<Progress> ShardedCheckpointer::resumeLatest(torch::optim::Optimizer& opt) {
  comm::Group& world = *place_.world;
  const bool reader = place_.replicas->rank() == 0;
  // The newest step of each shard (from its reader); the step to resume is the smallest.
  int64_t mine = kNotMine;
  std::string error;
  if (reader) {
    try {
      auto latest = shard_.latest();
      mine = latest ? stepOf(*latest) : kNone;
    } catch (const std::exception& e) {
      error = e.what();
      mine = kCorrupt;
    }
  }
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  comm::allgather(world, &mine, all.data(), 1, DataType::kInt64);
  std::optional<int64_t> step;
  bool any = false, corrupt = false;
  for (int64_t v : all) {
    if (v == kNotMine) continue;
    corrupt = corrupt || v == kCorrupt;
    any = any || v >= 0;
    step = step ? std::min(*step, v) : v;
  }
  if (corrupt) {
    SHOAL_THROW(InvalidArgument, "resume: {}",
                error.empty() ? "a shard's newest checkpoint is corrupt (see its rank)" : error);
  }
  // The layout must be this run's (checked where it was written: world rank 0), also when none
  // of this split's shards is there: a folder of another split's checkpoints is not a fresh
  // start (this run's saves would mix with them).
  std::string verdict;
  if (world.rank() == 0) {
    try {
      const std::optional<std::string> saved = readLayout(dir_);
      if (!saved && any) {
        verdict = fmt::format("the checkpoints in {} have no layout file", dir_);
      } else if (saved && *saved != place_.layout) {
        verdict = fmt::format(
            "the checkpoints in {} were written by another split ({}); this run's is ({}). "
            "Resharding to a new split is not supported: use the same split",
            dir_, *saved, place_.layout);
      }
    } catch (const std::exception& e) {
      verdict = e.what();
    }
  }
  verdict = comm::broadcastBytes(world, std::move(verdict), 0, size_t{1} << 20);
  if (!verdict.empty()) SHOAL_THROW(InvalidArgument, "resume: {}", verdict);
  if (!any) return std::nullopt;
  if (!step || *step < 0) {
    SHOAL_THROW(InvalidArgument, "resume: some shards have checkpoints in {} and others none",
                dir_);
  }
  std::string path;
  for (const auto& p : shard_.list()) {
    if (stepOf(p) == *step) path = p;
  }
  int found = !reader || !path.empty() ? 1 : 0;
  comm::allreduce(world, &found, 1, DataType::kInt32, ReduceOp::kMin);
  if (!found) {
    SHOAL_THROW(InvalidArgument,
                "resume: step {} (the newest every shard has) is missing for some shard in {} "
                "(were the older ones deleted?)",
                *step, dir_);
  }
  return shard_.load(*place_.replicas, path, module_, opt);
}

}  // namespace shoal::train
