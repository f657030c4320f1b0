#include "train/ddp_checkpoint.h"

#include <fmt/format.h>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/collective_verdict.h"
#include "train/hook_checkpoint.h"
#include "train/optimizer_state.h"
#include "train/reshard_checkpoint.h"
#include "train/state_shards.h"

namespace shoal::train {

namespace {

std::vector<std::pair<std::string, torch::Tensor>> trainable(torch::nn::Module& module,
                                                             torch::optim::Optimizer& opt) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  size_t given = 0;
  for (auto& g : opt.param_groups()) given += g.params().size();
  if (given != out.size()) {
    SHOAL_THROW(InvalidArgument,
                "sharded DDP checkpoint: the optimizer has {} parameters, the module {} "
                "trainable ones (make it over module->parameters())",
                given, out.size());
  }
  return out;
}

std::vector<std::string> namesOf(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.first);
  return names;
}

}  // namespace

std::string saveDdpShards(comm::Group& group, const std::string& dir, torch::nn::Module& module,
                          torch::optim::Optimizer& opt, const OptimizerOptions& options,
                          const Progress& progress, int keep, const ddp::CommHook* hook) {
  torch::NoGradGuard noGrad;
  const auto params = trainable(module, opt);
  const int64_t r = group.rank(), n = group.size();
  std::vector<FlatPiece> pieces;
  int64_t optimizerStep = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    // This rank's 1/N of the parameter's elements.
    const int64_t first = p.numel() * r / n, last = p.numel() * (r + 1) / n;
    auto state = exportState(opt, i);
    if (state) optimizerStep = state->step;
    if (first == last) continue;
    auto piece = [&](const torch::Tensor& t) {
      return t.detach().reshape(-1).narrow(0, first, last - first).contiguous();
    };
    pieces.push_back({shards::paramKey(name), p.sizes().vec(), first, piece(p)});
    if (!state) continue;
    for (auto& [key, tensor] : state->tensors) {
      pieces.push_back({shards::stateKey(key, name), p.sizes().vec(), first, piece(tensor)});
    }
  }
  if (r == 0) {
    for (auto& item : module.named_buffers(/*recurse=*/true)) {
      pieces.push_back({shards::bufferKey(item.key()), item.value().sizes().vec(), 0,
                        item.value().detach().reshape(-1).contiguous()});
    }
  }
  auto meta = shards::meta(module, progress, options, optimizerStep,
                           fmt::format("data parallel, {} ranks", n));
  if (hook) addHookState(*hook, namesOf(params), group.rank(), group.size(), pieces, meta);
  return saveShards(group, dir, progress.step, pieces, meta, keep);
}

std::optional<Progress> loadDdpShards(comm::Group& group, const std::string& dir,
                                      torch::nn::Module& module, torch::optim::Optimizer& opt,
                                      const OptimizerOptions& options, std::optional<int64_t> step,
                                      ddp::CommHook* hook) {
  torch::NoGradGuard noGrad;
  const std::optional<int64_t> chosen = shards::agreeOnStep(group, dir, step);
  if (!chosen) return std::nullopt;
  Progress progress;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from)
  std::vector<std::optional<ParamState>> states;
  std::optional<ddp::HookState> hookState;
  std::string noHookState;
  onEveryRank(group, "loading the checkpoint", [&] {
    const auto params = trainable(module, opt);
    ShardReader reader(dir, *chosen);
    shards::checkOptimizer(reader, options);
    progress = shards::progressOf(reader);
    const int64_t optimizerStep = shards::optimizerStepOf(reader);
    auto whole = [&](const std::string& key, const torch::Tensor& like) {
      auto t = torch::empty({like.numel()}, like.options().requires_grad(false));
      shards::readInto(reader, key, like.sizes().vec(), 0, t);
      return t.view(like.sizes());
    };
    for (const auto& [name, p] : params) {
      copies.emplace_back(p, whole(shards::paramKey(name), p));
      std::optional<ParamState> state;
      for (auto& key : shards::stateKeysOf(reader, name)) {
        if (!state) state.emplace().step = optimizerStep;
        state->tensors.emplace_back(key, whole(shards::stateKey(key, name), p));
      }
      states.push_back(std::move(state));
    }
    for (auto& item : module.named_buffers(/*recurse=*/true)) {
      copies.emplace_back(item.value(), whole(shards::bufferKey(item.key()), item.value()));
    }
    if (hook) {
      hookState =
          readHookState(reader, *hook, namesOf(params), group.rank(), group.size(), noHookState);
    }
  });
  onEveryRank(group, "restoring the optimizer state", [&] {
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i]) importState(opt, i, *states[i]);
    }
  });
  if (hook) restoreHookState(group, *hook, hookState, noHookState);
  for (auto& [into, from] : copies) into.copy_(from);
  return progress;
}

}  // namespace shoal::train
