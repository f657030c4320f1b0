#include "train/elastic_hook_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/log.h"
#include "train/collective_verdict.h"

namespace shoal::train {

namespace {

// The state's kind, step count and each tensor's key, parameter, sharing and length.
std::string encodeLayout(const ddp::HookState& state) {
  std::string out;
  putBytes(out, state.kind.data(), state.kind.size());
  putValue<int64_t>(out, state.steps);
  putValue<uint64_t>(out, state.tensors.size());
  for (const auto& t : state.tensors) {
    putBytes(out, t.key.data(), t.key.size());
    putValue<uint64_t>(out, t.param);
    putValue<uint8_t>(out, t.perRank ? 1 : 0);
    putValue<int64_t>(out, t.data.numel());
  }
  return out;
}

// The layout as a state whose tensors are zeros of their lengths; at most `maxElements` in all
// (checked before anything is allocated).
ddp::HookState decodeLayout(const std::string& bytes, const std::string& source,
                            int64_t maxElements) {
  ByteReader in(bytes, source);
  ddp::HookState state;
  state.kind = std::string(in.bytes());
  state.steps = in.get<int64_t>();
  const uint64_t n = in.count(25, "tensors");  // each at least a key's length and 17 bytes
  int64_t total = 0;
  for (uint64_t i = 0; i < n; ++i) {
    ddp::HookState::Tensor t;
    t.key = std::string(in.bytes());
    t.param = in.get<uint64_t>();
    t.perRank = in.get<uint8_t>() != 0;
    const auto numel = in.get<int64_t>();
    if (numel < 0 || numel > maxElements - total) {
      SHOAL_THROW(ProtocolError, "{}: a tensor of {} elements, past the {} the model allows",
                  source, numel, maxElements);
    }
    total += numel;
    t.data = torch::zeros({numel}, torch::kFloat32);
    state.tensors.push_back(std::move(t));
  }
  if (!in.atEnd()) SHOAL_THROW(ProtocolError, "{}: {} bytes too many", source, in.remaining());
  return state;
}

}  // namespace

ElasticHookState::ElasticHookState(std::shared_ptr<ddp::CommHook> hook,
                                   const torch::nn::Module& module, BucketsBuilt buckets)
    : buckets_(buckets) {
  if (!hook || hook->stateKind().empty()) return;
  hook_ = std::move(hook);
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    // A parameter's residual, velocity and PowerSGD's Q (smaller than the parameter) at most.
    maxElements_ += 3 * p.numel();
  }
}

// Bucket i holds parameter i alone; the hook keeps its per-parameter state from them (and
// carries what it held for each parameter over into them).
void ElasticHookState::makeParameterBuckets(comm::Group& group) {
  for (size_t i = 0; i < params_.size(); ++i) {
    ddp::GradBucket b;
    b.index = i;
    b.buffer = torch::zeros({params_[i].numel()}, params_[i].options().requires_grad(false));
    b.params = {i};
    b.offsets = {0};
    b.numels = {params_[i].numel()};
    b.shapes = {params_[i].sizes().vec()};
    hook_->makeState(group, b);
  }
}

// A copy at every commit: into the buffers of the copy two commits old where they fit, as a
// fresh allocation of a large state (a model's worth of residuals) costs page faults each time.
void ElasticHookState::take(int64_t step) {
  if (!hook_) return;
  const auto view = hook_->viewState();
  SHOAL_ASSERT(view.has_value(), "{} keeps {} state but exported none", hook_->name(),
               hook_->stateKind());
  if (last_.step != step) std::swap(before_, last_);
  last_.step = step;
  auto& into = last_.state;
  into.kind = view->kind;
  into.steps = view->steps;
  into.tensors.resize(view->tensors.size());
  for (size_t i = 0; i < view->tensors.size(); ++i) {
    const auto& from = view->tensors[i];
    auto& to = into.tensors[i];
    to.key = from.key;
    to.param = from.param;
    to.perRank = from.perRank;
    if (to.data.defined() && to.data.numel() == from.data.numel() &&
        to.data.dtype() == from.data.dtype()) {
      to.data.copy_(from.data.reshape(-1));
    } else {
      to.data = from.data.reshape(-1).clone();
    }
  }
}

void ElasticHookState::restore(comm::Group& group, int64_t step) {
  if (!hook_) return;
  for (Copy* c : {&last_, &before_}) {
    if (c->step > step) *c = Copy{};
  }
  const Copy* own = last_.step == step ? &last_ : before_.step == step ? &before_ : nullptr;
  if (buckets_ == BucketsBuilt::kAfterRestore) makeParameterBuckets(group);

  // Who holds the state of `step`.
  const int64_t mine = own ? 1 : 0;
  std::vector<int64_t> holds(static_cast<size_t>(group.size()));
  comm::allgather(group, &mine, holds.data(), 1, DataType::kInt64);
  const auto holders = std::count(holds.begin(), holds.end(), 1);
  if (holders == 0) {
    if (group.rank() == 0) {
      SHOAL_LOG_WARN("elastic: no rank holds the {} state of step {}: it starts from zero",
                     hook_->stateKind(), step);
    }
    return;
  }
  std::optional<ddp::HookState> mean;
  if (holders < group.size()) {
    const int source = static_cast<int>(std::find(holds.begin(), holds.end(), 1) - holds.begin());
    mean = holdersMean(group, own, source, holders);
  }
  onEveryRank(group, "restoring the compression state",
              [&] { hook_->importState(own ? own->state : *mean); });
}

// The lowest holder (`source`) says what the state holds; every holder adds its per-rank
// tensors, and `source` alone the shared ones (the same on every holder), in one all-reduce.
ddp::HookState ElasticHookState::holdersMean(comm::Group& group, const Copy* own, int source,
                                             int64_t holders) const {
  ddp::HookState ours;
  if (own) {
    ours = own->state;
    ours.sortTensors();
  }
  const std::string layout = comm::broadcastBytes(
      group, group.rank() == source ? encodeLayout(ours) : std::string(), source, size_t{1} << 26);
  ddp::HookState mean = decodeLayout(
      layout, fmt::format("compression state layout of rank {}", source), maxElements_);
  int64_t total = 0;
  for (const auto& t : mean.tensors) total += t.data.numel();
  auto flat = torch::zeros({total}, torch::kFloat32);
  onEveryRank(group, "gathering the compression state", [&] {
    if (!own) return;
    if (ours.kind != mean.kind || ours.tensors.size() != mean.tensors.size()) {
      SHOAL_THROW(InvalidArgument,
                  "rank {}: its compression state ({}) has {} tensors, rank {}'s ({}) has {}",
                  group.rank(), ours.kind, ours.tensors.size(), source, mean.kind,
                  mean.tensors.size());
    }
    int64_t at = 0;
    for (size_t i = 0; i < ours.tensors.size(); ++i) {
      const auto& t = ours.tensors[i];
      const auto& want = mean.tensors[i];
      const int64_t n = want.data.numel();
      if (t.key != want.key || t.param != want.param || t.perRank != want.perRank ||
          t.data.numel() != n) {
        SHOAL_THROW(InvalidArgument,
                    "rank {}: its compression state's '{}' of parameter {} does not match rank "
                    "{}'s",
                    group.rank(), t.key, t.param, source);
      }
      if (t.perRank || group.rank() == source) flat.narrow(0, at, n).copy_(t.data.reshape(-1));
      at += n;
    }
  });
  comm::allreduce(group, flat.data_ptr(), static_cast<size_t>(total), DataType::kFloat32,
                  ReduceOp::kSum);
  int64_t at = 0;
  for (auto& t : mean.tensors) {
    const int64_t n = t.data.numel();
    t.data = flat.narrow(0, at, n).clone();
    if (t.perRank) t.data.div_(static_cast<double>(holders));
    at += n;
  }
  return mean;
}

}  // namespace shoal::train
