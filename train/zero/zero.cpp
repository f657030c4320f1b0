#include "train/zero/zero.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <exception>
#include <fstream>
#include <set>
#include <unordered_map>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/autograd_hooks.h"
#include "train/optimizer_state.h"
#include "train/replica_sync.h"
#include "train/tensor_types.h"
#include "train/zero/zero_impl.h"

namespace shoal::train::zero {

// Note [Shard units]
// ZeRO shards per unit, not over one flat vector of all parameters: a unit is a group of
// parameters whose gradients are reduced together (a bucket) and, in stage 3, whose parameters
// are gathered together (a module). Each unit's parameters lie end to end in one flat buffer
// padded to a multiple of N, and rank r owns elements [r·s, (r+1)·s) of it (s = padded / N).
// Cutting every unit in N equal parts is what lets a unit's reduction be one reduce-scatter
// and its gathering one all-gather, each rank's part landing at a fixed place, while a bucket
// of gradients is ready: a single global cut would put most buckets on one or two owners and
// need a reduce to each. The price is at most N-1 elements of padding per unit.
//
// Units are kept in the order backward produces their gradients (reverse registration order;
// stage 3: the Sequential's last child first), the order reductions must start in on every
// rank; stage 3's forward walks them from the last to the first.

namespace {

int64_t roundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The process's peak resident set (VmHWM), in bytes; 0 if /proc is unreadable.
int64_t peakResidentBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

ZeroDataParallel::Impl::Impl(std::shared_ptr<torch::nn::Module> m, torch::nn::Sequential seq,
                             std::shared_ptr<comm::Group> g, ZeroOptions o)
    : module(std::move(m)), sequential(std::move(seq)), group(std::move(g)), options(o) {
  SHOAL_CHECK(module && group, "ZeroDataParallel needs a module and a group");
  rank = group->rank();
  size = group->size();
  if (options.stage < 1 || options.stage > 3) {
    SHOAL_THROW(InvalidArgument,
                "ZeroDataParallel: stage {} does not exist (1, 2 or 3; stage 0 is "
                "DistributedDataParallel)",
                options.stage);
  }
  if (options.stage == 3 && !sequential) {
    SHOAL_THROW(InvalidArgument,
                "ZeroDataParallel: stage 3 needs a torch::nn::Sequential (it gathers each "
                "child's parameters around its forward, and libtorch modules have no forward "
                "hooks)");
  }
  SHOAL_CHECK(options.bucketBytes > 0, "ZeroDataParallel: bucketBytes must be positive");
  if (options.commHook && options.stage != 1) {
    SHOAL_THROW(InvalidArgument,
                "ZeroDataParallel: a communication hook ({}) works with stage 1 only; stage {} "
                "reduce-scatters its gradients",
                options.commHook->name(), options.stage);
  }
  SHOAL_CHECK(options.clipNorm >= 0, "ZeroDataParallel: clipNorm {} is negative", options.clipNorm);
  for (auto& item : module->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  SHOAL_CHECK(!params.empty(), "ZeroDataParallel: the module has no trainable parameters");
  computeType = params.front().scalar_type();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (p.scalar_type() != computeType || !p.is_floating_point() || !p.device().is_cpu()) {
      SHOAL_THROW(InvalidArgument,
                  "ZeroDataParallel: parameter '{}' is {} on {}; every parameter must be a CPU "
                  "tensor of one floating type ({} here)",
                  names[i], std::string(c10::toString(p.scalar_type())), p.device().str(),
                  std::string(c10::toString(computeType)));
    }
  }
  mixed = computeType == torch::kBFloat16 || computeType == torch::kHalf;
  masterType = mixed ? torch::kFloat : computeType;
  for (auto& b : module->buffers(/*recurse=*/true)) buffers.push_back(b);

  if (size > 1) {
    checkSameParameters(*group, names, params, *module, "ZeroDataParallel");
    // The parameters go from rank 0 unit by unit in shardUnits(), straight into their flat
    // buffers: one broadcast of everything would first copy the whole model (twice its bytes
    // at the peak, which is what limits the largest model stage 3 can hold).
    broadcastFromRankZero(*group, buffers);
  }
  if (!options.broadcastBuffers) buffers.clear();
  buildUnits();
  shardUnits();
  std::vector<torch::Tensor> masters;
  for (auto& u : units) masters.push_back(u.master);
  optimizer = makeOptimizer(masters, options.optimizer, layerMap());
  registerHooks();
  resetIteration();
}

ZeroDataParallel::Impl::~Impl() {
  drain();
  for (auto& u : units) {
    try {
      if (u.gatherWork) u.gatherWork->wait();
    } catch (...) {
    }
  }
  alive.reset();
  for (size_t i = 0; i < accumulators.size(); ++i) accumulators[i]->del_post_hook(postHookKeys[i]);
}

void ZeroDataParallel::Impl::buildUnits() {
  std::vector<std::vector<size_t>> groups;
  if (options.stage == 3) {
    // One unit per child holding parameters, the last child first.
    std::unordered_map<const void*, size_t> index;
    for (size_t i = 0; i < params.size(); ++i) index[params[i].unsafeGetTensorImpl()] = i;
    std::vector<std::vector<size_t>> perChild;
    for (const auto& child : sequential->children()) {
      std::vector<size_t> mine;
      for (auto& p : child->parameters(/*recurse=*/true)) {
        auto it = index.find(p.unsafeGetTensorImpl());
        if (it != index.end()) mine.push_back(it->second);
      }
      perChild.push_back(std::move(mine));
    }
    size_t covered = 0;
    for (auto& c : perChild) covered += c.size();
    if (covered != params.size()) {
      SHOAL_THROW(InvalidArgument,
                  "ZeroDataParallel: stage 3 needs every parameter inside one child of the "
                  "Sequential ({} of {} are)",
                  covered, params.size());
    }
    childUnit.assign(perChild.size(), -1);
    int withParams = 0;
    for (auto& c : perChild) withParams += c.empty() ? 0 : 1;
    for (size_t c = 0; c < perChild.size(); ++c) {
      if (perChild[c].empty()) continue;
      childUnit[c] = --withParams;  // the last child is unit 0
    }
    for (size_t c = perChild.size(); c-- > 0;) {
      if (!perChild[c].empty()) groups.push_back(perChild[c]);
    }
  } else {
    // Buckets of about bucketBytes in reverse registration order.
    size_t bytes = 0;
    for (size_t i = params.size(); i-- > 0;) {
      const size_t pb = static_cast<size_t>(params[i].numel()) * params[i].element_size();
      if (groups.empty() || (bytes + pb > options.bucketBytes && !groups.back().empty())) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(i);
      bytes += pb;
    }
  }
  unitOf.assign(params.size(), 0);
  offsetOf.assign(params.size(), 0);
  for (auto& g : groups) {
    Unit u;
    for (size_t i : g) {
      unitOf[i] = units.size();
      offsetOf[i] = u.numel;
      u.params.push_back(i);
      u.offsets.push_back(u.numel);
      u.numel += params[i].numel();
    }
    u.padded = roundUp(std::max<int64_t>(u.numel, 1), size);
    u.shard = u.padded / size;
    units.push_back(std::move(u));
  }
}

// LAMB and LARS need each layer's norms: a layer (a parameter) is split over units' shards and
// ranks, so the map says where its pieces lie here and the partial sums are all-reduced.
// Padding is a layer of its own, excluded like a 1-D one (its elements stay zero).
LayerMap ZeroDataParallel::Impl::layerMap() const {
  LayerMap map;
  const size_t padding = params.size();
  map.oneDim.resize(params.size() + 1);
  for (size_t i = 0; i < params.size(); ++i) map.oneDim[i] = params[i].dim() <= 1;
  map.oneDim[padding] = true;
  for (size_t t = 0; t < units.size(); ++t) {
    const Unit& u = units[t];
    int64_t covered = 0;
    for (const Held& h : heldPieces(u)) {
      map.segments.push_back({t, h.shardOffset, h.count, h.param});
      covered += h.count;
    }
    // What is left of the shard is the unit's padding, at its end.
    if (covered < u.shard) map.segments.push_back({t, covered, u.shard - covered, padding});
  }
  if (size > 1) {
    auto g = group;
    map.sumAcrossShards = [g](std::vector<double>& sums) {
      comm::allreduce(*g, sums.data(), sums.size(), DataType::kFloat64, ReduceOp::kSum);
    };
  }
  return map;
}

void ZeroDataParallel::Impl::shardUnits() {
  torch::NoGradGuard noGrad;
  const auto compute = torch::TensorOptions().dtype(computeType);
  for (auto& u : units) {
    u.flat = torch::zeros({u.padded}, compute);
    for (size_t k = 0; k < u.params.size(); ++k) {
      auto& p = params[u.params[k]];
      u.flat.narrow(0, u.offsets[k], p.numel()).copy_(p.reshape(-1));
      // The parameter's own memory is freed here (the module holds the same tensor).
      p.set_data(aliasOf(u.flat, u.offsets[k], p.sizes()));
    }
    if (size > 1) {
      comm::broadcast(*group, u.flat.data_ptr(), static_cast<size_t>(u.padded), wireType(), 0);
    }
    // Stages 1-2 with an fp32 module: the master shard is the rank's part of the parameters
    // themselves, so stepping it updates them in place and the all-gather sends from there.
    const bool aliased = !mixed && options.stage < 3;
    u.master = aliased ? aliasOf(u.flat, rank * u.shard, {u.shard})
                       : shardOf(u.flat, u).to(masterType).clone();
    u.master.requires_grad_(true);
    if (options.stage == 1) {
      // ZeRO-1 keeps the full gradients (they are all-reduced); an fp32 shard's gradient is
      // the rank's part of them.
      u.fullGrad = torch::zeros({u.padded}, compute);
      u.master.mutable_grad() = mixed ? torch::zeros({u.shard}, u.master.options())
                                      : aliasOf(u.fullGrad, rank * u.shard, {u.shard});
    } else {
      u.master.mutable_grad() = torch::zeros({u.shard}, u.master.options());
    }
    if (options.stage == 3) release(u);
  }
  if (options.commHook) {
    for (size_t i = 0; i < units.size(); ++i) {
      Unit& u = units[i];
      u.hookBucket = std::make_unique<ddp::GradBucket>();
      auto& b = *u.hookBucket;
      b.index = i;
      b.buffer = u.fullGrad;
      b.params = u.params;
      b.offsets = u.offsets;
      for (size_t p : u.params) {
        b.numels.push_back(params[p].numel());
        b.shapes.push_back(params[p].sizes().vec());
      }
      b.state = options.commHook->makeState(*group, b);
    }
  }
}

void ZeroDataParallel::Impl::registerHooks() {
  std::weak_ptr<bool> weak = alive;
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    if (!acc) {
      SHOAL_THROW(InvalidArgument, "ZeroDataParallel: parameter '{}' is not a leaf", names[i]);
    }
    postHookKeys.push_back(acc->add_post_hook(std::make_unique<AfterAccumulate>([this, weak, i] {
      if (weak.lock()) onGradient(i);
    })));
    // Held, or autograd makes a new node (without the hook) for the next forward.
    accumulators.push_back(std::move(acc));
  }
}

void ZeroDataParallel::Impl::resetIteration() {
  arrived.assign(params.size(), 0);
  for (auto& u : units) {
    u.pending = u.params.size();
    u.started = false;
    u.reduceWork.reset();
  }
  nextToStart = 0;
  inFlight.clear();
  hookFailure = nullptr;
}

// --- gradients ----------------------------------------------------------------------------

void ZeroDataParallel::Impl::onGradient(size_t i) {
  torch::NoGradGuard noGrad;
  auto& p = params[i];
  const auto& g = p.grad();
  if (!g.defined()) return;
  Unit& u = units[unitOf[i]];
  if (!u.fullGrad.defined()) u.fullGrad = spareGrads.zeros(u.padded, p.options());
  u.fullGrad.narrow(0, offsetOf[i], p.numel()).add_(g.reshape(-1));
  // The gradient now lives in the unit's buffer: free the parameter's own copy.
  p.mutable_grad().reset();
  if (arrived[i]) return;
  arrived[i] = 1;
  if (--u.pending == 0 && options.stage == 3 && !options.keepParametersForBackward) release(u);
  if (sync) {
    try {
      startReady();
    } catch (...) {
      if (!hookFailure) hookFailure = std::current_exception();
      throw;
    }
  }
}

void ZeroDataParallel::Impl::startReady() {
  while (nextToStart < units.size() && units[nextToStart].pending == 0) {
    startReduce(units[nextToStart++]);
  }
}

void ZeroDataParallel::Impl::startReduce(Unit& u) {
  if (!u.fullGrad.defined()) u.fullGrad = spareGrads.zeros(u.padded, u.flat.options());
  u.started = true;
  if (u.hookBucket) {
    u.reduceWork = options.commHook->start(*group, *u.hookBucket);
    u.hookStarted = true;
    return;
  }
  if (options.stage == 1) {
    u.reduceWork = comm::allreduceAsync(*group, u.fullGrad.data_ptr(),
                                        static_cast<size_t>(u.padded), wireType(), ReduceOp::kAvg);
    return;
  }
  torch::Tensor into = u.master.grad();
  if (mixed) into = u.lowGrad = torch::empty({u.shard}, u.flat.options());
  u.reduceWork = comm::reduceScatterAsync(*group, u.fullGrad.data_ptr(), into.data_ptr(),
                                          static_cast<size_t>(u.shard), wireType(), ReduceOp::kAvg);
  // Each reduction in flight holds its unit's full gradients: when communication falls behind
  // backward (ranks sharing cores), waiting here bounds the memory instead of letting every
  // unit's gradients pile up.
  inFlight.push_back(&u);
  const size_t limit = options.maxInFlightReductions;
  while (limit > 0 && inFlight.size() > limit) {
    Unit* oldest = inFlight.front();
    inFlight.pop_front();
    completeReduce(*oldest);
  }
}

void ZeroDataParallel::Impl::completeReduce(Unit& u) {
  if (u.hookStarted) {
    // A hook may leave nothing in flight (null Work) and still have its finish() to run.
    u.hookStarted = false;
    auto work = std::move(u.reduceWork);
    u.reduceWork.reset();
    if (work) work->wait();
    options.commHook->finish(*group, *u.hookBucket);
    if (mixed) u.master.mutable_grad().copy_(shardOf(u.fullGrad, u));
    return;
  }
  if (!u.reduceWork) return;
  auto work = std::move(u.reduceWork);
  u.reduceWork.reset();
  work->wait();
  if (options.stage == 1) {
    if (mixed) u.master.mutable_grad().copy_(shardOf(u.fullGrad, u));
    return;
  }
  if (mixed) u.master.mutable_grad().copy_(u.lowGrad);
  u.lowGrad = torch::Tensor();
  spareGrads.give(std::move(u.fullGrad));  // sent: ZeRO-2/3 keep only the shard
}

void ZeroDataParallel::Impl::finishIteration() {
  torch::NoGradGuard noGrad;
  if (sync) {
    // Units some parameter of which got no gradient start now (with zeros for it), in order.
    for (; nextToStart < units.size(); ++nextToStart) startReduce(units[nextToStart]);
    for (auto& u : units) completeReduce(u);
  }
  if (options.stage == 3) {
    for (auto& u : units) {
      if (options.keepParametersForBackward || u.pending > 0) release(u);
    }
  }
  resetIteration();
}

std::exception_ptr ZeroDataParallel::Impl::drain() noexcept {
  std::exception_ptr first;
  for (auto& u : units) {
    u.hookStarted = false;  // abandoned: its finish() must not run on a failed exchange
    for (auto* w : {&u.reduceWork, &u.gatherWork}) {
      if (!*w) continue;
      try {
        (*w)->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      w->reset();
    }
    if (!u.gathered) {
      // A prefetch waited for above (or abandoned midway): not marked gathered, so free it.
      freeFlat(u);
      u.gatherSend = torch::Tensor();
    }
  }
  return first;
}

// --- the step -----------------------------------------------------------------------------

double ZeroDataParallel::Impl::clipGradients() {
  double squares = 0;
  for (auto& u : units) squares += u.master.grad().to(torch::kDouble).pow(2).sum().item<double>();
  comm::allreduce(*group, &squares, 1, DataType::kFloat64, ReduceOp::kSum);
  const double norm = std::sqrt(squares);
  // As torch::nn::utils::clip_grad_norm_: scale by max / (norm + 1e-6) when that is below one.
  const double coef = options.clipNorm / (norm + 1e-6);
  if (coef < 1) {
    for (auto& u : units) u.master.mutable_grad().mul_(coef);
  }
  return norm;
}

void ZeroDataParallel::Impl::gatherAfterStep() {
  torch::NoGradGuard noGrad;
  std::vector<std::shared_ptr<comm::Work>> works;
  std::vector<torch::Tensor> sends;
  try {
    for (auto& u : units) {
      // fp32: the master is the rank's part of the buffer, so the all-gather is in place.
      torch::Tensor send = mixed ? u.master.detach().to(computeType) : shardOf(u.flat, u);
      works.push_back(comm::allgatherAsync(*group, send.data_ptr(), u.flat.data_ptr(),
                                           static_cast<size_t>(u.shard), wireType()));
      sends.push_back(std::move(send));
    }
  } catch (...) {
    for (auto& w : works) {
      try {
        w->wait();
      } catch (...) {
      }
    }
    throw;
  }
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// --- the wrapper ---------------------------------------------------------------------------

ZeroDataParallel::ZeroDataParallel(std::shared_ptr<torch::nn::Module> module,
                                   std::shared_ptr<comm::Group> group, ZeroOptions options)
    : impl_(std::make_unique<Impl>(std::move(module), nullptr, std::move(group), options)) {}

ZeroDataParallel::ZeroDataParallel(torch::nn::Sequential module, std::shared_ptr<comm::Group> group,
                                   ZeroOptions options)
    : impl_(std::make_unique<Impl>(module.ptr(), module, std::move(group), options)) {}

ZeroDataParallel::~ZeroDataParallel() = default;

void ZeroDataParallel::beforeForward() {
  if (impl_->size > 1 && !impl_->buffers.empty()) {
    broadcastFromRankZero(*impl_->group, impl_->buffers);
  }
}

void ZeroDataParallel::backward(const torch::Tensor& loss) {
  Impl& m = *impl_;
  m.sync = sync_;
  try {
    loss.backward();
    m.finishIteration();
  } catch (...) {
    // The buffers belong to the communication still in flight: wait for it, then report the
    // iteration's first communication failure (the likely root cause).
    std::exception_ptr first = m.drain();
    if (!first) first = m.hookFailure;
    m.resetIteration();
    std::rethrow_exception(first ? first : std::current_exception());
  }
}

double ZeroDataParallel::step() {
  Impl& m = *impl_;
  double norm = -1;
  if (m.options.clipNorm > 0) norm = m.clipGradients();
  m.optimizer->step();
  {
    torch::NoGradGuard noGrad;
    if (m.options.stage == 1) {
      for (auto& u : m.units) u.fullGrad.zero_();
    }
    if (m.mixed || m.options.stage > 1) {
      for (auto& u : m.units) u.master.mutable_grad().zero_();
    }
  }
  if (m.options.stage < 3) m.gatherAfterStep();
  return norm;
}

void ZeroDataParallel::setLearningRate(double lr) {
  train::setLearningRate(*impl_->optimizer, lr);
}

MemoryReport ZeroDataParallel::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  std::set<const c10::StorageImpl*> seen;
  auto add = [&](const torch::Tensor& t, int64_t& into) {
    if (!t.defined()) return;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (seen.insert(s).second) into += static_cast<int64_t>(s->nbytes());
  };
  for (auto& u : m.units) add(u.flat, r.parameterBytes);
  for (auto& u : m.units) add(u.master, m.mixed ? r.optimizerBytes : r.parameterBytes);
  for (auto& u : m.units) {
    add(u.fullGrad, r.gradientBytes);
    add(u.master.grad(), r.gradientBytes);
    add(u.lowGrad, r.gradientBytes);
  }
  for (size_t t = 0; t < m.units.size(); ++t) {
    if (auto state = exportState(*m.optimizer, t)) {
      for (auto& [key, tensor] : state->tensors) add(tensor, r.optimizerBytes);
    }
  }
  r.spareBytes = m.spare.bytes() + m.spareGrads.bytes();
  r.peakResidentBytes = peakResidentBytes();
  return r;
}

int64_t ZeroDataParallel::parameterCount() const {
  int64_t n = 0;
  for (auto& u : impl_->units) n += u.numel;
  return n;
}

int64_t ZeroDataParallel::paddingCount() const {
  int64_t n = 0;
  for (auto& u : impl_->units) n += u.padded - u.numel;
  return n;
}

int ZeroDataParallel::stage() const {
  return impl_->options.stage;
}

comm::Group& ZeroDataParallel::group() {
  return *impl_->group;
}

}  // namespace shoal::train::zero
