#include "train/elastic_replicated.h"

#include <fmt/format.h>

#include <cstring>

#include "comm/collectives.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/log.h"

namespace shoal::train {

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'E', 'L', '1'};

// A tensor's type, element count and bytes (common/byte_codec.h).
void putTensor(std::string& out, const torch::Tensor& t) {
  auto c = t.contiguous();
  putValue<int32_t>(out, static_cast<int32_t>(c.scalar_type()));
  putValue<int64_t>(out, c.numel());
  out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Into `like`'s shape and type: the receiver's own model decides them, the sender's bytes must
// match.
torch::Tensor getTensor(ByteReader& in, const torch::Tensor& like, const std::string& name) {
  const auto type = in.get<int32_t>();
  const auto numel = in.get<int64_t>();
  if (type != static_cast<int32_t>(like.scalar_type()) || numel != like.numel()) {
    SHOAL_THROW(InvalidArgument,
                "{}: {} holds {} elements of type {}, this model has {} of type {} (saved from "
                "another model?)",
                in.source(), name, numel, type, like.numel(), c10::toString(like.scalar_type()));
  }
  const auto bytes = in.take(static_cast<uint64_t>(numel) * like.element_size());
  auto t = torch::empty_like(like, torch::MemoryFormat::Contiguous);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Copies `from` into `into` where the shapes allow it (no allocation at each commit), else
// clones.
void keep(torch::Tensor& into, const torch::Tensor& from) {
  if (into.defined() && into.sizes() == from.sizes() && into.dtype() == from.dtype()) {
    into.copy_(from);
  } else {
    into = from.detach().clone();
  }
}

}  // namespace

ReplicatedState::ReplicatedState(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                 std::shared_ptr<ddp::CommHook> hook, LossScaler* scaler)
    : model_(model),
      optimizer_(optimizer),
      scaler_(scaler),
      hookState_(std::move(hook), model, BucketsBuilt::kAfterRestore) {
  for (auto& g : optimizer_.param_groups()) baseLr_.push_back(g.options().get_lr());
}

void ReplicatedState::scaleLr(double factor) {
  auto& groups = optimizer_.param_groups();
  SHOAL_CHECK(groups.size() == baseLr_.size(),
              "ElasticState: the optimizer has {} parameter groups, {} at construction",
              groups.size(), baseLr_.size());
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(baseLr_[i] * factor);
}

void ReplicatedState::enter(comm::Group& group, const comm::View& view) {
  if (!taken_) commit(group, ElasticProgress{});
  if (view.needsSync()) sync(group, view);
  // Every rank now holds the step all continue from (the source's), whatever it had committed.
  hookState_.restore(group, snapshot_.progress.step);
}

void ReplicatedState::commit(comm::Group&, const ElasticProgress& progress) {
  take(progress);
  hookState_.take(progress.step);
}

void ReplicatedState::leave() {
  restore();
}

std::vector<torch::Tensor> ReplicatedState::modelTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : model_.parameters()) out.push_back(p);
  for (const auto& b : model_.buffers()) out.push_back(b);
  return out;
}

void ReplicatedState::take(const ElasticProgress& progress) {
  torch::NoGradGuard noGrad;
  const auto tensors = modelTensors();
  snapshot_.model.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) keep(snapshot_.model[i], tensors[i]);
  const size_t n = model_.parameters().size();
  snapshot_.optimizer.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto now = exportState(optimizer_, i);
    auto& kept = snapshot_.optimizer[i];
    if (!now) {
      kept.reset();
      continue;
    }
    const bool sameKeys = kept && kept->tensors.size() == now->tensors.size();
    if (!sameKeys) kept = ParamState{};
    kept->step = now->step;
    kept->tensors.resize(now->tensors.size());
    for (size_t k = 0; k < now->tensors.size(); ++k) {
      kept->tensors[k].first = now->tensors[k].first;
      keep(kept->tensors[k].second, now->tensors[k].second);
    }
  }
  if (scaler_) snapshot_.scaler = scaler_->state();
  snapshot_.progress = progress;
  taken_ = true;
}

void ReplicatedState::restore() {
  torch::NoGradGuard noGrad;
  const auto tensors = modelTensors();
  SHOAL_CHECK(tensors.size() == snapshot_.model.size(), "elastic: the model changed shape");
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(snapshot_.model[i]);
  replaceStates(optimizer_, snapshot_.optimizer);
  if (scaler_ && snapshot_.scaler) scaler_->loadState(*snapshot_.scaler);
  // Gradients of the step that failed are stale.
  for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
}

std::string ReplicatedState::encode() const {
  std::string out(kMagic, sizeof kMagic);
  putValue<int64_t>(out, snapshot_.progress.step);
  putValue<int64_t>(out, snapshot_.progress.epoch);
  putValue<int64_t>(out, snapshot_.progress.position);
  putValue<int64_t>(out, static_cast<int64_t>(snapshot_.model.size()));
  for (const auto& t : snapshot_.model) putTensor(out, t);
  putValue<int64_t>(out, static_cast<int64_t>(snapshot_.optimizer.size()));
  for (const auto& s : snapshot_.optimizer) {
    putValue<int8_t>(out, s ? 1 : 0);
    if (!s) continue;
    putValue<int64_t>(out, s->step);
    putValue<int32_t>(out, static_cast<int32_t>(s->tensors.size()));
    for (const auto& [name, t] : s->tensors) {
      putBytes(out, name.data(), name.size());
      putTensor(out, t);
    }
  }
  // Last, and only with a scaler: states written before it existed read as without one.
  if (snapshot_.scaler) {
    putValue<double>(out, snapshot_.scaler->scale);
    putValue<int64_t>(out, snapshot_.scaler->growthTracker);
    putValue<int64_t>(out, snapshot_.scaler->skippedSteps);
    putValue<int64_t>(out, snapshot_.scaler->steps);
  }
  return out;
}

// Into the snapshot and the live objects, checked against this rank's own model before
// anything is kept.
void ReplicatedState::decode(const std::string& bytes, const std::string& what) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    SHOAL_THROW(InvalidArgument, "{}: not a Shoal elastic state", what);
  }
  ByteReader r(std::string_view(bytes).substr(sizeof kMagic), what);
  Snapshot s;
  s.progress.step = r.get<int64_t>();
  s.progress.epoch = r.get<int64_t>();
  s.progress.position = r.get<int64_t>();
  if (s.progress.step < 0 || s.progress.epoch < 0 || s.progress.position < 0) {
    SHOAL_THROW(InvalidArgument, "{}: negative progress", what);
  }
  const auto tensors = modelTensors();
  if (r.get<int64_t>() != static_cast<int64_t>(tensors.size())) {
    SHOAL_THROW(InvalidArgument, "{}: saved from a model with another number of tensors", what);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    s.model.push_back(getTensor(r, tensors[i], fmt::format("model tensor {}", i)));
  }
  const auto params = model_.parameters();
  if (r.get<int64_t>() != static_cast<int64_t>(params.size())) {
    SHOAL_THROW(InvalidArgument, "{}: optimizer state for another number of parameters", what);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (r.get<int8_t>() == 0) {
      s.optimizer.emplace_back();
      continue;
    }
    ParamState ps;
    ps.step = r.get<int64_t>();
    const auto k = r.get<int32_t>();
    if (k < 0 || k > 16) SHOAL_THROW(InvalidArgument, "{}: {} optimizer tensors", what, k);
    for (int32_t j = 0; j < k; ++j) {
      const auto nameBytes = r.bytes();
      if (nameBytes.size() > 64)
        SHOAL_THROW(InvalidArgument, "{}: a name of {} bytes", what, nameBytes.size());
      std::string name(nameBytes);
      auto t = getTensor(r, params[i], fmt::format("optimizer {} of parameter {}", name, i));
      ps.tensors.emplace_back(std::move(name), std::move(t));
    }
    s.optimizer.push_back(std::move(ps));
  }
  if (!r.atEnd()) {
    if (!scaler_) {
      SHOAL_THROW(InvalidArgument,
                  "{}: holds a loss scaler's state, and this job has none "
                  "(ElasticOptions::lossScaler)",
                  what);
    }
    LossScalerState scaler;
    scaler.scale = r.get<double>();
    scaler.growthTracker = r.get<int64_t>();
    scaler.skippedSteps = r.get<int64_t>();
    scaler.steps = r.get<int64_t>();
    try {
      scaler.check();
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "{}: {}", what, e.what());
    }
    s.scaler = scaler;
  } else if (scaler_) {
    SHOAL_LOG_WARN("{}: holds no loss scaler's state: the scaler keeps its own (scale {})", what,
                   scaler_->currentScale());
  }
  if (!r.atEnd()) {
    SHOAL_THROW(InvalidArgument, "{}: {} bytes after the end", what, r.remaining());
  }
  snapshot_ = std::move(s);
  taken_ = true;
  restore();
}

// The view's source sends its committed state to everyone (one broadcast of its size, one of
// its bytes); every rank then holds and has committed the same state.
void ReplicatedState::sync(comm::Group& group, const comm::View& view) {
  const int source = view.source();
  std::string bytes;
  if (group.rank() == source) bytes = encode();
  int64_t n = static_cast<int64_t>(bytes.size());
  comm::broadcast(group, &n, 1, DataType::kInt64, source);
  bytes.resize(static_cast<size_t>(n));
  comm::broadcast(group, bytes.data(), bytes.size(), DataType::kUInt8, source);
  if (group.rank() != source) {
    decode(bytes, fmt::format("elastic state from rank {}", source));
  }
}

}  // namespace shoal::train
