#include "train/elastic.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "comm/collectives.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sealed_file.h"

namespace shoal::train {

namespace {

// Thrown by commit() to leave the user's function when joiners wait; caught by run() only.
struct AdmitJoiners {};

// The membership gave up (below the minimum, or never admitted): run() lets it out as it is,
// instead of trying the next view.
class GaveUp : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

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

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ElasticProgress ElasticProgress::after(int64_t nextPosition, int64_t epochSize) const {
  ElasticProgress p{step + 1, epoch, nextPosition};
  if (nextPosition >= epochSize) {
    p.epoch += 1;
    p.position = 0;
  }
  return p;
}

ElasticState::ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
                           torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           ElasticOptions options)
    : context_(std::move(context)),
      group_(std::move(group)),
      model_(model),
      optimizer_(optimizer),
      options_(std::move(options)) {
  SHOAL_CHECK(context_.membership && context_.store && group_,
              "ElasticState needs an elastic job's context (shoal run --elastic)");
  if (options_.admitEvery < 1) {
    SHOAL_THROW(InvalidArgument, "ElasticState: admitEvery {} < 1", options_.admitEvery);
  }
  if (options_.lrReferenceSize < 0) {
    SHOAL_THROW(InvalidArgument, "ElasticState: lrReferenceSize {} < 0", options_.lrReferenceSize);
  }
  if (options_.lrReferenceSize == 0) {
    options_.lrReferenceSize = context_.membership->options().initialSize;
  }
  for (auto& g : optimizer_.param_groups()) baseLr_.push_back(g.options().get_lr());
}

double ElasticState::lrFactor(int size) const {
  const double ratio = static_cast<double>(size) / options_.lrReferenceSize;
  switch (options_.lrScaling) {
    case LrScaling::kNone:
      return 1;
    case LrScaling::kLinear:
      return ratio;
    case LrScaling::kSqrt:
      return std::sqrt(ratio);
  }
  return 1;
}

void ElasticState::scaleLr() {
  if (options_.lrScaling == LrScaling::kNone) return;
  auto& groups = optimizer_.param_groups();
  SHOAL_CHECK(groups.size() == baseLr_.size(),
              "ElasticState: the optimizer has {} parameter groups, {} at construction",
              groups.size(), baseLr_.size());
  const double factor = lrFactor(group_->size());
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(baseLr_[i] * factor);
}

std::vector<torch::Tensor> ElasticState::modelTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : model_.parameters()) out.push_back(p);
  for (const auto& b : model_.buffers()) out.push_back(b);
  return out;
}

void ElasticState::take(const ElasticProgress& progress) {
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
  snapshot_.progress = progress;
  taken_ = true;
}

void ElasticState::restore() {
  torch::NoGradGuard noGrad;
  const auto tensors = modelTensors();
  SHOAL_CHECK(tensors.size() == snapshot_.model.size(), "elastic: the model changed shape");
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(snapshot_.model[i]);
  for (size_t i = 0; i < snapshot_.optimizer.size(); ++i) {
    if (snapshot_.optimizer[i]) {
      importState(optimizer_, i, *snapshot_.optimizer[i]);
    } else {
      clearState(optimizer_, i);
    }
  }
  // Gradients of the step that failed are stale.
  for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
}

std::string ElasticState::encode() const {
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
  return out;
}

// Into the snapshot, checked against this rank's own model before anything is kept.
void ElasticState::decode(const std::string& bytes, const std::string& what) {
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
    SHOAL_THROW(InvalidArgument, "{}: {} bytes after the end", what, r.remaining());
  }
  snapshot_ = std::move(s);
  taken_ = true;
}

void ElasticState::load(const std::string& path) {
  std::string bytes;
  try {
    bytes = readSealedFile(path);
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "elastic state {}: not a Shoal elastic state ({})", path,
                e.what());
  }
  decode(bytes, "elastic state " + path);
  restore();
}

// The view's source sends its committed state to everyone (one broadcast of its size, one of
// its bytes); every rank then holds and has committed the same state.
void ElasticState::sync() {
  const auto& v = view();
  const int source = v.source();
  std::string bytes;
  if (group_->rank() == source) bytes = encode();
  int64_t n = static_cast<int64_t>(bytes.size());
  comm::broadcast(*group_, &n, 1, DataType::kInt64, source);
  bytes.resize(static_cast<size_t>(n));
  comm::broadcast(*group_, bytes.data(), bytes.size(), DataType::kUInt8, source);
  if (group_->rank() != source) {
    decode(bytes, fmt::format("elastic state from rank {}", source));
    restore();
  }
}

void ElasticState::reform(const std::vector<int>& failed) {
  const auto started = std::chrono::steady_clock::now();
  const comm::View old = view();
  const int64_t mine = snapshot_.progress.step;
  group_.reset();  // the failed view's connections and shared memory go now
  restore();
  try {
    context_.membership->next(mine, failed);
  } catch (const TimeoutError& e) {
    if (options_.checkpointPath.empty()) throw GaveUp(e.what());
    // Every survivor writes the same state; the sealed file makes each write whole.
    writeSealedFile(options_.checkpointPath, encode());
    throw GaveUp(fmt::format("{}; the state of step {} was written to {}", e.what(), mine,
                             options_.checkpointPath));
  }
  group_ = comm::groupForView(context_, view());
  if (view().needsSync()) sync();
  stats_.viewChanges += 1;
  stats_.lastRecoverySeconds = secondsSince(started);
  stats_.lastResumedStep = snapshot_.progress.step;
  SHOAL_LOG_INFO("elastic: view {} of {} workers (was {}), rank {}, from step {} in {:.3f} s",
                 view().generation, view().size(), old.size(), group_->rank(),
                 snapshot_.progress.step, stats_.lastRecoverySeconds);
  scaleLr();
  if (onViewChange) onViewChange(old, view());
}

void ElasticState::commit(const ElasticProgress& progress) {
  take(progress);
  const auto& v = view();
  if (++commits_ % options_.admitEvery != 0 ||
      v.size() >= context_.membership->options().range.maxSize) {
    return;
  }
  int32_t admit = group_->rank() == 0 && context_.membership->joinersWaiting() ? 1 : 0;
  comm::broadcast(*group_, &admit, 1, DataType::kInt32, 0);
  if (admit) throw AdmitJoiners{};
}

void ElasticState::run(const std::function<void(comm::Group&)>& fn) {
  if (!taken_) take(ElasticProgress{});
  std::optional<std::vector<int>> reformWithout;  // set: the view ended, these members failed
  while (true) {
    try {
      if (reformWithout) {
        reform(*reformWithout);
        reformWithout.reset();
      } else if (!synced_) {
        // A joiner's first view: the state comes from the running members.
        if (view().needsSync()) sync();
        scaleLr();
      }
      synced_ = true;
      fn(*group_);
      // A worker still waiting to join has nothing left to do (Membership::finish).
      if (group_->rank() == 0) context_.membership->finish(snapshot_.progress.step);
      return;
    } catch (const AdmitJoiners&) {
      reformWithout.emplace();
    } catch (const GaveUp& e) {
      throw TimeoutError(e.what());
    } catch (const Error& e) {
      // Forming the next view can fail the same way (a member died meanwhile): that view ends
      // too, and the members try the one after it.
      if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const TimeoutError*>(&e)) throw;
      reformWithout.emplace();
      const auto& v = view();
      if (group_ && e.origin() >= 0 && e.origin() < v.size() && e.origin() != group_->rank()) {
        reformWithout->push_back(v.members[static_cast<size_t>(e.origin())].id);
      }
      SHOAL_LOG_WARN("elastic: member {} in view {}: {}; forming the next view",
                     context_.membership->id(), v.generation, e.what());
      synced_ = true;
    }
  }
}

}  // namespace shoal::train
