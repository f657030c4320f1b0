#include "train/pipeline/stage_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"

namespace shoal::train::pipeline {

namespace {

// The step a checkpoint file holds, from its name "ckpt-<8 digits>.pt".
int64_t stepOf(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  SHOAL_ASSERT(name.size() > 8 && name.rfind("ckpt-", 0) == 0, "checkpoint name '{}'", name);
  return std::stoll(name.substr(5));
}

}  // namespace

StageCheckpointer::StageCheckpointer(std::string dir, int keep, Pipeline& pipeline)
    : dir_(std::move(dir)),
      pipeline_(pipeline),
      shard_(fmt::format("{}/stage-{}", dir_, pipeline.grid().stage), keep) {}

std::string StageCheckpointer::layoutText() const {
  const Schedule& s = pipeline_.schedule();
  return fmt::format("pipeline layout v1: {} virtual stages on {} ranks x {} chunks, layers [{}]\n",
                     s.virtualStages(), s.stages, s.chunks,
                     fmt::join(pipeline_.plan().boundaries, ", "));
}

std::string StageCheckpointer::save(torch::optim::Optimizer& opt, const Progress& progress) {
  const Grid& g = pipeline_.grid();
  if (g.world->rank() == 0) writeSealedFile(dir_ + "/layout", layoutText());
  return shard_.save(*g.data, pipeline_.stageModule(), opt, progress);
}

std::optional<Progress> StageCheckpointer::resumeLatest(torch::optim::Optimizer& opt) {
  const Grid& g = pipeline_.grid();
  // The newest step of this stage's shard; the step to resume is the smallest over the stages.
  int64_t mine = -1;
  std::string error;
  if (g.data->rank() == 0) {
    try {
      if (auto latest = shard_.latest()) mine = stepOf(*latest);
    } catch (const std::exception& e) {
      error = e.what();
      mine = -2;
    }
  }
  std::vector<int64_t> all(static_cast<size_t>(g.world->size()));
  comm::allgather(*g.world, &mine, all.data(), 1, DataType::kInt64);
  int64_t step = -1;
  bool any = false, corrupt = false;
  for (int s = 0; s < g.stages; ++s) {
    const int64_t v = all[static_cast<size_t>(s)];  // replica 0 of stage s is world rank s
    corrupt = corrupt || v == -2;
    any = any || v >= 0;
    step = s == 0 ? v : std::min(step, v);
  }
  if (corrupt) {
    SHOAL_THROW(InvalidArgument, "pipeline resume: {}",
                error.empty() ? "a stage's newest checkpoint is corrupt (see its rank)" : error);
  }
  if (!any) return std::nullopt;
  if (step < 0) {
    SHOAL_THROW(InvalidArgument,
                "pipeline resume: some stages have checkpoints in {} and others none", dir_);
  }
  // The layout must be this run's (checked where it was written: world rank 0).
  std::string verdict;
  if (g.world->rank() == 0) {
    try {
      const std::string saved = readSealedFile(dir_ + "/layout");
      auto trim = [](std::string t) {
        while (!t.empty() && t.back() == '\n') t.pop_back();
        return t;
      };
      if (saved != layoutText()) {
        verdict = fmt::format(
            "the checkpoints in {} were written by another split ({}); this run's is ({}). "
            "Resharding to a new split is not supported: use the same stages, chunks and "
            "boundaries",
            dir_, trim(saved), trim(layoutText()));
      }
    } catch (const std::exception& e) {
      verdict = e.what();
    }
  }
  int64_t n = static_cast<int64_t>(verdict.size());
  comm::broadcast(*g.world, &n, 1, DataType::kInt64, 0);
  verdict.resize(static_cast<size_t>(std::clamp<int64_t>(n, 0, 4096)));
  comm::broadcast(*g.world, verdict.data(), verdict.size(), DataType::kUInt8, 0);
  if (!verdict.empty()) SHOAL_THROW(InvalidArgument, "pipeline resume: {}", verdict);
  std::string path;
  for (const auto& p : shard_.list()) {
    if (stepOf(p) == step) path = p;
  }
  int found = path.empty() ? 0 : 1;
  if (g.data->rank() != 0) found = 1;  // replica 0 reads the file for its stage
  int allFound = found;
  comm::allreduce(*g.world, &allFound, 1, DataType::kInt32, ReduceOp::kMin);
  if (!allFound) {
    SHOAL_THROW(InvalidArgument,
                "pipeline resume: step {} (the newest every stage has) is missing for some "
                "stage in {} (were the older ones deleted?)",
                step, dir_);
  }
  return shard_.load(*g.data, path, pipeline_.stageModule(), opt);
}

}  // namespace shoal::train::pipeline
