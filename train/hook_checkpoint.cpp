#include "train/hook_checkpoint.h"

#include <fmt/format.h>

#include <unordered_map>

#include "common/error.h"
#include "common/log.h"
#include "train/collective_verdict.h"
#include "train/state_shards.h"

namespace shoal::train {

namespace {

constexpr char kPrefix[] = "hook/";

std::string hookKey(const std::string& key, const std::string& name) {
  return kPrefix + key + "/" + name;
}

}  // namespace

void addHookState(const ddp::CommHook& hook, const std::vector<std::string>& names, int rank,
                  int size, std::vector<FlatPiece>& pieces,
                  std::map<std::string, std::string>& meta) {
  auto state = hook.exportState();
  if (!state) return;
  meta["hook"] = state->kind;
  meta["hook_steps"] = std::to_string(state->steps);
  state->sortTensors();
  for (auto& t : state->tensors) {
    SHOAL_ASSERT(t.param < names.size(), "{}: state for parameter {} of {}", hook.name(), t.param,
                 names.size());
    const int64_t n = t.data.numel();
    const std::string name = hookKey(t.key, names[t.param]);
    if (t.perRank) {
      pieces.push_back({name, {size, n}, rank * n, t.data.reshape(-1).contiguous()});
    } else if (rank == 0) {
      pieces.push_back({name, {n}, 0, t.data.reshape(-1).contiguous()});
    }
  }
}

std::optional<ddp::HookState> readHookState(const ShardReader& reader, const ddp::CommHook& hook,
                                            const std::vector<std::string>& names, int rank,
                                            int size, std::string& why) {
  const auto& meta = reader.meta();
  const auto saved = meta.find("hook");
  const std::string kind = hook.stateKind();
  if (saved == meta.end()) {
    if (!kind.empty()) {
      why = fmt::format(
          "checkpoint step {} holds no {} compression state (written without it): the "
          "error-feedback state starts from zero",
          reader.step(), kind);
    }
    return std::nullopt;
  }
  if (saved->second != kind) {
    why = fmt::format(
        "checkpoint step {} holds {} compression state, which this job's {} does not use: not "
        "loaded",
        reader.step(), saved->second, kind.empty() ? hook.name() : kind + " compression");
    return std::nullopt;
  }
  ddp::HookState state;
  state.kind = kind;
  state.steps = shards::metaCount(reader, "hook_steps");
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  for (const auto& name : reader.names()) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t slash = name.find('/', sizeof(kPrefix) - 1);
    const auto param =
        slash == std::string::npos ? index.end() : index.find(name.substr(slash + 1));
    if (param == index.end()) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint step {}: compression state '{}' is not of a parameter of this model",
                  reader.step(), name);
    }
    const auto shape = reader.shape(name);
    if (reader.dtype(name) != torch::kFloat32 || shape.empty() || shape.size() > 2) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint step {}: compression state '{}' is not float32 "
                  "of one or two dimensions",
                  reader.step(), name);
    }
    ddp::HookState::Tensor t;
    t.key = name.substr(sizeof(kPrefix) - 1, slash - (sizeof(kPrefix) - 1));
    t.param = param->second;
    t.perRank = shape.size() == 2;
    if (t.perRank && shape[0] != reader.worldSize()) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint step {}: compression state '{}' has {} rows for {} ranks",
                  reader.step(), name, shape[0], reader.worldSize());
    }
    if (!t.perRank) {
      t.data = reader.readFull(name);
    } else if (size == reader.worldSize()) {
      t.data = torch::empty({shape[1]}, torch::kFloat32);
      reader.read(name, rank * shape[1], t.data);  // this rank's own row
    } else {
      t.data = reader.readFull(name).mean(0);
    }
    state.tensors.push_back(std::move(t));
  }
  return state;
}

void restoreHookState(comm::Group& group, ddp::CommHook& hook,
                      const std::optional<ddp::HookState>& state, const std::string& why) {
  if (state) {
    onEveryRank(group, "restoring the compression state", [&] { hook.importState(*state); });
  } else if (!why.empty() && group.rank() == 0) {
    SHOAL_LOG_WARN("{}", why);
  }
}

}  // namespace shoal::train
