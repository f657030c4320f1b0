#include "train/state_shards.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/optimizer_config.h"
#include "train/collective_verdict.h"

namespace shoal::train::shards {

std::string paramKey(const std::string& name) {
  return "param/" + name;
}
std::string stateKey(const std::string& key, const std::string& name) {
  return "optim/" + key + "/" + name;
}
std::string bufferKey(const std::string& name) {
  return "buffer/" + name;
}

std::vector<std::string> stateKeysOf(const ShardReader& reader, const std::string& name) {
  return stateKeysOf(reader.names(), name);
}

std::vector<std::string> stateKeysOf(const std::vector<std::string>& names,
                                     const std::string& name) {
  std::vector<std::string> keys;
  const std::string suffix = "/" + name;
  for (const auto& n : names) {
    if (n.rfind("optim/", 0) != 0 || n.size() <= 6 + suffix.size()) continue;
    if (n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string key = n.substr(6, n.size() - 6 - suffix.size());
    if (key.find('/') == std::string::npos) keys.push_back(key);
  }
  return keys;
}

std::map<std::string, std::string> meta(torch::nn::Module& module, const Progress& progress,
                                        const OptimizerOptions& opt, int64_t optimizerStep,
                                        const std::string& writer) {
  std::string modules;
  for (auto& item : module.named_modules("", /*include_self=*/false)) modules += item.key() + "\n";
  return {{"modules", modules},
          {"epoch", std::to_string(progress.epoch)},
          {"batch_in_epoch", std::to_string(progress.batchInEpoch)},
          {"step", std::to_string(progress.step)},
          {"optimizer", std::string(toString(opt.kind))},
          {"optimizer_step", std::to_string(optimizerStep)},
          {"writer", writer}};
}

int64_t metaCount(const ShardReader& reader, const std::string& key) {
  auto it = reader.meta().find(key);
  if (it == reader.meta().end()) {
    SHOAL_THROW(InvalidArgument, "checkpoint step {}: its meta has no '{}'", reader.step(), key);
  }
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  SHOAL_THROW(InvalidArgument, "checkpoint step {}: meta '{}' is '{}', not a count", reader.step(),
              key, it->second);
}

Progress progressOf(const ShardReader& reader) {
  return {metaCount(reader, "epoch"), metaCount(reader, "batch_in_epoch"),
          metaCount(reader, "step")};
}

int64_t optimizerStepOf(const ShardReader& reader) {
  return metaCount(reader, "optimizer_step");
}

std::optional<int64_t> agreeOnStep(comm::Group& group, const std::string& dir,
                                   std::optional<int64_t> step) {
  onEveryRank(group, "finding the checkpoint", [&] {
    if (!step) step = ShardReader::latestStep(dir);
  });
  int64_t mine = step ? *step : -1, lowest = mine;
  comm::allreduce(group, &lowest, 1, DataType::kInt64, ReduceOp::kMin);
  comm::allreduce(group, &mine, 1, DataType::kInt64, ReduceOp::kMax);
  if (lowest != mine) {
    SHOAL_THROW(InvalidArgument,
                "rank {}: the ranks see different checkpoints in {} (steps {} and {}): is the "
                "folder shared?",
                group.rank(), dir, lowest, mine);
  }
  return step;
}

void checkOptimizer(const ShardReader& reader, const OptimizerOptions& opt) {
  auto it = reader.meta().find("optimizer");
  const std::string saved = it == reader.meta().end() ? "(none)" : it->second;
  if (saved != toString(opt.kind)) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint step {} holds {} optimizer state; this job's optimizer is {}",
                reader.step(), saved, toString(opt.kind));
  }
}

void readInto(const ShardReader& reader, const std::string& key, const std::vector<int64_t>& shape,
              int64_t offset, torch::Tensor out) {
  if (!reader.has(key)) {
    SHOAL_THROW(InvalidArgument, "checkpoint step {} has no '{}' (written for another model?)",
                reader.step(), key);
  }
  if (reader.shape(key) != shape) {
    SHOAL_THROW(InvalidArgument, "checkpoint step {}: '{}' is [{}], the model's is [{}]",
                reader.step(), key, fmt::join(reader.shape(key), ", "), fmt::join(shape, ", "));
  }
  if (out.numel() == 0) return;
  if (reader.dtype(key) == out.scalar_type() && out.is_contiguous()) {
    reader.read(key, offset, out);
    return;
  }
  auto tmp = torch::empty({out.numel()}, torch::TensorOptions().dtype(reader.dtype(key)));
  reader.read(key, offset, tmp);
  out.copy_(tmp.view(out.sizes()));
}

}  // namespace shoal::train::shards
