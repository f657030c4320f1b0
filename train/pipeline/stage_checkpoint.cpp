#include "train/pipeline/stage_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "comm/collectives.h"

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

namespace {

// "pipeline layout v1: V virtual stages on S ranks x C chunks, layers [0, b1, ..., n]..." (the
// format above) -> b1..b(V-1) when S and C are `stages` and `chunks`.
std::optional<std::vector<int>> parseBoundaries(const std::string& layout, int stages, int chunks) {
  int virtualStages = 0, ranks = 0, perRank = 0, consumed = 0;
  if (std::sscanf(layout.c_str(),
                  "pipeline layout v1: %d virtual stages on %d ranks x %d chunks, layers [%n",
                  &virtualStages, &ranks, &perRank, &consumed) != 3 ||
      consumed == 0 || ranks != stages || perRank != chunks) {
    return std::nullopt;
  }
  std::vector<int> layers;
  const char* p = layout.c_str() + consumed;
  for (;;) {
    int layer = 0, n = 0;
    if (std::sscanf(p, "%d%n", &layer, &n) != 1) return std::nullopt;
    layers.push_back(layer);
    p += n;
    if (*p == ']') break;
    if (p[0] != ',' || p[1] != ' ') return std::nullopt;
    p += 2;
  }
  if (static_cast<int>(layers.size()) != virtualStages + 1) return std::nullopt;
  return std::vector<int>(layers.begin() + 1, layers.end() - 1);
}

}  // namespace

std::optional<std::vector<int>> savedBoundaries(comm::Group& world, const std::string& dir,
                                                int stages, int chunks) {
  std::string answer;  // "-" none, else the boundaries, space-separated
  if (world.rank() == 0) {
    answer = "-";
    if (const auto layout = readLayout(dir)) {  // corrupt: InvalidArgument naming it
      if (auto b = parseBoundaries(*layout, stages, chunks))
        answer = fmt::format("{}", fmt::join(*b, " "));
    }
  }
  answer = comm::broadcastBytes(world, std::move(answer), 0, size_t{1} << 16);
  if (answer == "-") return std::nullopt;
  std::vector<int> boundaries;
  size_t at = 0;
  while (at < answer.size()) {
    size_t end = answer.find(' ', at);
    if (end == std::string::npos) end = answer.size();
    boundaries.push_back(std::stoi(answer.substr(at, end - at)));
    at = end + 1;
  }
  return boundaries;
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
