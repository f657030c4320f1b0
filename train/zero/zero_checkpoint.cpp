// ZeroDataParallel's sharded checkpoints: each rank writes what its shards hold (master
// parameters and optimizer state, cut at the parameters' boundaries so the checkpoint names
// whole parameters, train/state_shards.h); loading reads, for this job's layout, the ranges
// this rank's shards hold from whatever files the writer's layout put them in.
#include <fmt/format.h>

#include "common/error.h"
#include "train/collective_verdict.h"
#include "train/hook_checkpoint.h"
#include "train/optimizer_state.h"
#include "train/state_shards.h"
#include "train/zero/zero.h"
#include "train/zero/zero_impl.h"

namespace shoal::train::zero {

// Where load() takes the state from: a sharded checkpoint, or whole tensors by name (elastic).
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual int64_t optimizerStep() const = 0;
  // The optimizer's state keys held for parameter `name` ("exp_avg", ...).
  virtual std::vector<std::string> stateKeys(const std::string& name) const = 0;
  // Elements [offset, offset + out.numel()) of `key`, which must have `shape`.
  virtual void read(const std::string& key, const std::vector<int64_t>& shape, int64_t offset,
                    torch::Tensor out) const = 0;
};

namespace {

class CheckpointSource : public StateSource {
 public:
  explicit CheckpointSource(const ShardReader& reader) : reader_(reader) {}
  int64_t optimizerStep() const override { return shards::optimizerStepOf(reader_); }
  std::vector<std::string> stateKeys(const std::string& name) const override {
    return shards::stateKeysOf(reader_, name);
  }
  void read(const std::string& key, const std::vector<int64_t>& shape, int64_t offset,
            torch::Tensor out) const override {
    shards::readInto(reader_, key, shape, offset, out);
  }

 private:
  const ShardReader& reader_;
};

class WholeSource : public StateSource {
 public:
  WholeSource(const std::map<std::string, torch::Tensor>& whole, int64_t step)
      : whole_(whole), step_(step) {}
  int64_t optimizerStep() const override { return step_; }
  std::vector<std::string> stateKeys(const std::string& name) const override {
    std::vector<std::string> names;
    for (const auto& [n, t] : whole_) names.push_back(n);
    return shards::stateKeysOf(names, name);
  }
  void read(const std::string& key, const std::vector<int64_t>& shape, int64_t offset,
            torch::Tensor out) const override {
    auto it = whole_.find(key);
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    if (it == whole_.end() || it->second.numel() != numel) {
      SHOAL_THROW(InvalidArgument, "elastic state: '{}' is {} (the model has {} elements)", key,
                  it == whole_.end() ? "missing" : std::to_string(it->second.numel()), numel);
    }
    if (out.numel() > 0) out.copy_(it->second.narrow(0, offset, out.numel()).view(out.sizes()));
  }

 private:
  const std::map<std::string, torch::Tensor>& whole_;
  int64_t step_;
};

}  // namespace

std::vector<FlatPiece> ZeroDataParallel::Impl::statePieces(bool withBuffers,
                                                           int64_t& optimizerStep) const {
  torch::NoGradGuard noGrad;
  std::vector<FlatPiece> pieces;
  optimizerStep = 0;
  for (size_t t = 0; t < units.size(); ++t) {
    auto state = exportState(*optimizer, t);
    if (state) optimizerStep = state->step;
    for (const auto& h : heldPieces(units[t])) {
      const auto shape = params[h.param].sizes().vec();
      auto piece = [&](const torch::Tensor& shard) {
        return shard.detach().narrow(0, h.shardOffset, h.count).contiguous();
      };
      const std::string& name = names[h.param];
      pieces.push_back(
          FlatPiece{shards::paramKey(name), shape, h.paramOffset, piece(units[t].master)});
      if (!state) continue;
      for (auto& [key, tensor] : state->tensors) {
        pieces.push_back(
            FlatPiece{shards::stateKey(key, name), shape, h.paramOffset, piece(tensor)});
      }
    }
  }
  if (withBuffers) {
    for (auto& item : module->named_buffers(/*recurse=*/true)) {
      auto b = item.value().detach().reshape(-1).contiguous();
      pieces.push_back({shards::bufferKey(item.key()), item.value().sizes().vec(), 0, b});
    }
  }
  return pieces;
}

// Reads this rank's part into fresh shards first, then puts it in place: nothing of the job's
// state changes unless every rank read all of its part.
void ZeroDataParallel::Impl::loadFrom(const std::string& what,
                                      const std::function<const StateSource&()>& open) {
  torch::NoGradGuard noGrad;
  std::vector<torch::Tensor> masters;
  std::vector<std::optional<ParamState>> states;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> into;  // (buffer, from)
  onEveryRank(*group, what, [&] {
    const StateSource& source = open();
    const int64_t optimizerStep = source.optimizerStep();
    for (const Unit& u : units) {
      auto master = torch::zeros_like(u.master);
      std::vector<std::string> keys;
      if (!u.params.empty()) keys = source.stateKeys(names[u.params.front()]);
      std::optional<ParamState> state;
      if (!keys.empty()) {
        state.emplace();
        state->step = optimizerStep;
        for (auto& key : keys) state->tensors.emplace_back(key, torch::zeros_like(u.master));
      }
      for (const auto& h : heldPieces(u)) {
        const auto shape = params[h.param].sizes().vec();
        const std::string& name = names[h.param];
        auto part = [&](torch::Tensor& shard) { return shard.narrow(0, h.shardOffset, h.count); };
        source.read(shards::paramKey(name), shape, h.paramOffset, part(master));
        if (!state) continue;
        for (auto& [key, tensor] : state->tensors) {
          source.read(shards::stateKey(key, name), shape, h.paramOffset, part(tensor));
        }
      }
      masters.push_back(master);
      states.push_back(std::move(state));
    }
    for (auto& item : module->named_buffers(/*recurse=*/true)) {
      auto from = torch::empty({item.value().numel()}, item.value().options());
      source.read(shards::bufferKey(item.key()), item.value().sizes().vec(), 0, from);
      into.emplace_back(item.value(), from.view(item.value().sizes()));
    }
  });
  onEveryRank(*group, "restoring the optimizer state", [&] {
    for (size_t t = 0; t < units.size(); ++t) {
      if (states[t]) importState(*optimizer, t, *states[t]);
    }
  });
  for (size_t t = 0; t < units.size(); ++t) units[t].master.copy_(masters[t]);
  for (auto& [buffer, from] : into) buffer.copy_(from);
  if (options.stage < 3) gatherAfterStep();
}

std::string ZeroDataParallel::save(const std::string& dir, const Progress& progress, int keep) {
  Impl& m = *impl_;
  int64_t optimizerStep = 0;
  auto pieces = m.statePieces(/*withBuffers=*/m.rank == 0, optimizerStep);
  auto meta = shards::meta(*m.module, progress, m.options.optimizer, optimizerStep,
                           fmt::format("zero stage {}, {} ranks", m.options.stage, m.size));
  if (m.options.commHook) addHookState(*m.options.commHook, m.names, m.rank, m.size, pieces, meta);
  return saveShards(*m.group, dir, progress.step, pieces, meta, keep);
}

std::optional<Progress> ZeroDataParallel::load(const std::string& dir,
                                               std::optional<int64_t> step) {
  Impl& m = *impl_;
  const std::optional<int64_t> chosen = shards::agreeOnStep(*m.group, dir, step);
  if (!chosen) return std::nullopt;
  Progress progress;
  std::optional<ShardReader> reader;
  std::optional<CheckpointSource> source;
  // Stages 2-3 and stage 1 without compression: the default hook, which keeps no state (a
  // checkpoint that holds some then says it is not used).
  const auto hook = m.options.commHook ? m.options.commHook : ddp::averageAllreduce();
  std::optional<ddp::HookState> hookState;
  std::string noHookState;
  m.loadFrom("loading the checkpoint", [&]() -> const StateSource& {
    reader.emplace(dir, *chosen);
    shards::checkOptimizer(*reader, m.options.optimizer);
    progress = shards::progressOf(*reader);
    hookState = readHookState(*reader, *hook, m.names, m.rank, m.size, noHookState);
    return source.emplace(*reader);
  });
  restoreHookState(*m.group, *hook, hookState, noHookState);
  return progress;
}

std::vector<FlatPiece> ZeroDataParallel::statePieces(int64_t& optimizerStep) const {
  return impl_->statePieces(/*withBuffers=*/true, optimizerStep);
}

void ZeroDataParallel::loadState(const std::map<std::string, torch::Tensor>& whole,
                                 int64_t optimizerStep) {
  const WholeSource source(whole, optimizerStep);
  impl_->loadFrom("loading the elastic state", [&]() -> const StateSource& { return source; });
}

}  // namespace shoal::train::zero
