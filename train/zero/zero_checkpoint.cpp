// ZeroDataParallel's sharded checkpoints: each rank writes what its shards hold (master
// parameters and optimizer state, cut at the parameters' boundaries so the checkpoint names
// whole parameters, train/state_shards.h); loading reads, for this job's layout, the ranges
// this rank's shards hold from whatever files the writer's layout put them in.
#include <fmt/format.h>

#include "common/error.h"
#include "train/collective_verdict.h"
#include "train/optimizer_state.h"
#include "train/state_shards.h"
#include "train/zero/zero.h"
#include "train/zero/zero_impl.h"

namespace shoal::train::zero {

std::string ZeroDataParallel::save(const std::string& dir, const Progress& progress, int keep) {
  Impl& m = *impl_;
  torch::NoGradGuard noGrad;
  std::vector<FlatPiece> pieces;
  int64_t optimizerStep = 0;
  for (size_t t = 0; t < m.units.size(); ++t) {
    auto state = exportState(*m.optimizer, t);
    if (state) optimizerStep = state->step;
    for (const auto& h : m.heldPieces(m.units[t])) {
      const auto shape = m.params[h.param].sizes().vec();
      auto piece = [&](const torch::Tensor& shard) {
        return shard.detach().narrow(0, h.shardOffset, h.count).contiguous();
      };
      const std::string& name = m.names[h.param];
      pieces.push_back(
          FlatPiece{shards::paramKey(name), shape, h.paramOffset, piece(m.units[t].master)});
      if (!state) continue;
      for (auto& [key, tensor] : state->tensors) {
        pieces.push_back(
            FlatPiece{shards::stateKey(key, name), shape, h.paramOffset, piece(tensor)});
      }
    }
  }
  if (m.rank == 0) {
    for (auto& item : m.module->named_buffers(/*recurse=*/true)) {
      auto b = item.value().detach().reshape(-1).contiguous();
      pieces.push_back({shards::bufferKey(item.key()), item.value().sizes().vec(), 0, b});
    }
  }
  return saveShards(*m.group, dir, progress.step, pieces,
                    shards::meta(*m.module, progress, m.options.optimizer, optimizerStep,
                                 fmt::format("zero stage {}, {} ranks", m.options.stage, m.size)),
                    keep);
}

std::optional<Progress> ZeroDataParallel::load(const std::string& dir,
                                               std::optional<int64_t> step) {
  Impl& m = *impl_;
  torch::NoGradGuard noGrad;
  const std::optional<int64_t> chosen = shards::agreeOnStep(*m.group, dir, step);
  if (!chosen) return std::nullopt;

  Progress progress;
  // Read into fresh shards first: nothing of the job's state changes unless every rank read
  // all of its part.
  std::vector<torch::Tensor> masters;
  std::vector<std::optional<ParamState>> states;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;  // (into, from)
  onEveryRank(*m.group, "loading the checkpoint", [&] {
    ShardReader reader(dir, *chosen);
    shards::checkOptimizer(reader, m.options.optimizer);
    progress = shards::progressOf(reader);
    const int64_t optimizerStep = shards::optimizerStepOf(reader);
    for (const Unit& u : m.units) {
      auto master = torch::zeros_like(u.master);
      std::vector<std::string> keys;
      if (!u.params.empty()) keys = shards::stateKeysOf(reader, m.names[u.params.front()]);
      std::optional<ParamState> state;
      if (!keys.empty()) {
        state.emplace();
        state->step = optimizerStep;
        for (auto& key : keys) state->tensors.emplace_back(key, torch::zeros_like(u.master));
      }
      for (const auto& h : m.heldPieces(u)) {
        const auto shape = m.params[h.param].sizes().vec();
        const std::string& name = m.names[h.param];
        auto part = [&](torch::Tensor& shard) { return shard.narrow(0, h.shardOffset, h.count); };
        shards::readInto(reader, shards::paramKey(name), shape, h.paramOffset, part(master));
        if (!state) continue;
        for (auto& [key, tensor] : state->tensors) {
          shards::readInto(reader, shards::stateKey(key, name), shape, h.paramOffset, part(tensor));
        }
      }
      masters.push_back(master);
      states.push_back(std::move(state));
    }
    for (auto& item : m.module->named_buffers(/*recurse=*/true)) {
      auto from = torch::empty({item.value().numel()}, item.value().options());
      shards::readInto(reader, shards::bufferKey(item.key()), item.value().sizes().vec(), 0, from);
      buffers.emplace_back(item.value(), from.view(item.value().sizes()));
    }
  });
  onEveryRank(*m.group, "restoring the optimizer state", [&] {
    for (size_t t = 0; t < m.units.size(); ++t) {
      if (states[t]) importState(*m.optimizer, t, *states[t]);
    }
  });
  for (size_t t = 0; t < m.units.size(); ++t) m.units[t].master.copy_(masters[t]);
  for (auto& [into, from] : buffers) into.copy_(from);
  if (m.options.stage < 3) m.gatherAfterStep();
  return progress;
}

}  // namespace shoal::train::zero
