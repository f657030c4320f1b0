#include "train/ddp_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>

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

// The bucket order a DDP job saved (meta "ddp_bucket_order"), if any. InvalidArgument when it
// is not a list of up to `params` indices (adoptBucketOrder checks that it is a permutation).
std::optional<std::vector<size_t>> savedBucketOrder(const ShardReader& reader, size_t params) {
  const auto it = reader.meta().find("ddp_bucket_order");
  if (it == reader.meta().end()) return std::nullopt;
  const std::string& text = it->second;
  std::vector<size_t> order;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    // Nine digits at most: an index, not a number to overflow.
    if (order.size() == params || item.empty() || item.size() > 9 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint step {}: meta 'ddp_bucket_order' is not an order of the model's {} "
                  "parameters (at '{}')",
                  reader.step(), params, item.substr(0, 20));
    }
    order.push_back(std::stoul(item));
    at = comma + 1;
  }
  if (order.size() != params) {
    SHOAL_THROW(
        InvalidArgument,
        "checkpoint step {}: meta 'ddp_bucket_order' orders {} parameters, the model has {}",
        reader.step(), order.size(), params);
  }
  return order;
}

}  // namespace

std::string saveDdpShards(comm::Group& group, const std::string& dir, torch::nn::Module& module,
                          torch::optim::Optimizer& opt, const OptimizerOptions& options,
                          const Progress& progress, int keep, DistributedDataParallel* ddp) {
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
  if (ddp != nullptr && ddp->commHook() != nullptr) {
    addHookState(*ddp->commHook(), namesOf(params), group.rank(), group.size(), pieces, meta);
    std::string order;
    for (const auto& bucket : ddp->bucketLayout()) {
      for (size_t i : bucket) {
        if (!order.empty()) order += ',';
        order += std::to_string(i);
      }
    }
    meta["ddp_bucket_order"] = order;
  }
  return saveShards(group, dir, progress.step, pieces, meta, keep);
}

std::optional<Progress> loadDdpShards(comm::Group& group, const std::string& dir,
                                      torch::nn::Module& module, torch::optim::Optimizer& opt,
                                      const OptimizerOptions& options, std::optional<int64_t> step,
                                      DistributedDataParallel* ddp) {
  ddp::CommHook* hook = ddp != nullptr ? ddp->commHook() : nullptr;
  torch::NoGradGuard noGrad;
  const std::optional<int64_t> chosen = shards::agreeOnStep(group, dir, step);
  if (!chosen) return std::nullopt;
  Progress progress;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from)
  std::vector<std::optional<ParamState>> states;
  std::optional<ddp::HookState> hookState;
  std::string noHookState;
  std::optional<std::vector<size_t>> bucketOrder;
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
      // Only from a job of this size: rank 0's gradient order, which the rebuild would give.
      if (reader.worldSize() == group.size()) bucketOrder = savedBucketOrder(reader, params.size());
    }
  });
  onEveryRank(group, "restoring the optimizer state", [&] {
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i]) importState(opt, i, *states[i]);
    }
  });
  if (bucketOrder) {
    onEveryRank(group, "restoring the bucket order", [&] { ddp->adoptBucketOrder(*bucketOrder); });
  }
  if (hook) restoreHookState(group, *hook, hookState, noHookState);
  for (auto& [into, from] : copies) into.copy_(from);
  return progress;
}

}  // namespace shoal::train
