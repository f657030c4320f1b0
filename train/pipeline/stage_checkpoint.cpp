#include "train/pipeline/stage_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace shoal::train::pipeline {

ShardPlace shardPlace(const Pipeline& pipeline) {
  const Grid& g = pipeline.grid();
  const Schedule& s = pipeline.schedule();
  const int tensor = g.tensor ? g.tensor->size() : 1;
  ShardPlace place;
  place.world = g.world;
  place.replicas = g.data;
  place.shard = tensor > 1 ? fmt::format("stage-{}-tensor-{}", g.stage, g.tensorRank)
                           : fmt::format("stage-{}", g.stage);
  place.layout = fmt::format(
      "pipeline layout v1: {} virtual stages on {} ranks x {} chunks, "
      "layers [{}]",
      s.virtualStages(), s.stages, s.chunks, fmt::join(pipeline.plan().boundaries, ", "));
  if (tensor > 1) place.layout += fmt::format(", tensor {}", tensor);
  return place;
}

StageCheckpointer::StageCheckpointer(std::string dir, int keep, Pipeline& pipeline)
    : shards_(std::move(dir), keep, shardPlace(pipeline), pipeline.stageModule()) {}

std::string StageCheckpointer::save(torch::optim::Optimizer& opt, const Progress& progress) {
  return shards_.save(opt, progress);
}

std::optional<Progress> StageCheckpointer::resumeLatest(torch::optim::Optimizer& opt) {
  return shards_.resumeLatest(opt);
}

}  // namespace shoal::train::pipeline
