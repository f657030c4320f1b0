// ZeroDataParallel's stage 3: a unit's full parameters gathered around its forward and its
// backward, freed in between (the forward the wrapper drives, the autograd function that
// gathers again for backward, prefetching, and GatheredParameters for evaluation and export).
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>

#include "train/zero/zero.h"
#include "train/zero/zero_impl.h"

namespace shoal::train::zero {

namespace {

// Stage 3: an identity on a unit's output whose backward runs just before the unit's own
// backward: it gathers the unit's parameters again (they were freed after its forward) and
// starts gathering the next unit's.
class RegatherForBackward : public torch::autograd::Function<RegatherForBackward> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               ZeroDataParallel::Impl* impl, int64_t unit) {
    ctx->saved_data["impl"] = reinterpret_cast<int64_t>(impl);
    ctx->saved_data["unit"] = unit;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* impl = reinterpret_cast<ZeroDataParallel::Impl*>(ctx->saved_data["impl"].toInt());
    impl->gatherForBackward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// Stage 3 frees a unit's full parameters by taking its storage's memory away, and gathers them
// into memory given back to the same storage: the module's parameters (and whatever autograd
// saved of them for backward) are aliases of that storage, so they see the new memory without
// being touched. The memory taken goes to a few spare blocks per size (Note [Spare blocks]).
void ZeroDataParallel::Impl::allocateFlat(Unit& u) {
  const torch::Tensor& flat = u.flat;
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(spare.take(bytes, *s->allocator()));
  s->set_nbytes(bytes);
}

void ZeroDataParallel::Impl::freeFlat(Unit& u) {
  const torch::Tensor& flat = u.flat;
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = s->nbytes();
  spare.give(bytes, s->set_data_ptr(at::DataPtr(nullptr, flat.device())));
  s->set_nbytes(0);
}

void ZeroDataParallel::Impl::startGather(Unit& u) {
  if (u.gathered || u.gatherWork) return;
  allocateFlat(u);
  u.gatherSend = mixed ? u.master.detach().to(computeType) : u.master.detach();
  u.gatherWork = comm::allgatherAsync(*group, u.gatherSend.data_ptr(), u.flat.data_ptr(),
                                      static_cast<size_t>(u.shard), wireType());
}

void ZeroDataParallel::Impl::ensureGathered(size_t unit) {
  Unit& u = units[unit];
  if (u.gathered) return;
  startGather(u);
  auto work = std::move(u.gatherWork);
  u.gatherWork.reset();
  work->wait();
  u.gatherSend = torch::Tensor();
  u.gathered = true;
}

void ZeroDataParallel::Impl::release(Unit& u) {
  if (!u.gathered) return;
  freeFlat(u);
  u.gathered = false;
}

void ZeroDataParallel::Impl::gatherForBackward(size_t unit) {
  try {
    ensureGathered(unit);
    if (options.prefetch && unit + 1 < units.size()) startGather(units[unit + 1]);
  } catch (...) {
    if (!hookFailure) hookFailure = std::current_exception();
    throw;
  }
}

torch::Tensor ZeroDataParallel::forward(const torch::Tensor& input) {
  Impl& m = *impl_;
  if (!m.sequential) {
    SHOAL_THROW(InvalidArgument,
                "ZeroDataParallel::forward needs the Sequential constructor; call the module's "
                "own forward for stages 1-2");
  }
  if (m.options.stage < 3) return m.sequential->forward(input);
  const bool training = torch::GradMode::is_enabled();
  torch::Tensor x = input;
  size_t child = 0;
  try {
    for (auto& layer : *m.sequential) {
      const int unit = m.childUnit[child++];
      if (unit < 0) {
        x = layer.forward(x);
        continue;
      }
      const auto u = static_cast<size_t>(unit);
      m.ensureGathered(u);
      if (m.options.prefetch && u > 0) m.startGather(m.units[u - 1]);
      x = layer.forward(x);
      if (training && x.requires_grad()) {
        x = RegatherForBackward::apply(x, &m, static_cast<int64_t>(u));
        // The last unit's backward comes first: it stays gathered. With
        // keepParametersForBackward every unit does.
        if (u > 0 && !m.options.keepParametersForBackward) m.release(m.units[u]);
      } else {
        m.release(m.units[u]);
      }
    }
  } catch (...) {
    std::exception_ptr first = m.drain();
    std::rethrow_exception(first ? first : std::current_exception());
  }
  return x;
}

ZeroDataParallel::GatheredParameters::GatheredParameters(ZeroDataParallel& z) : z_(z) {
  Impl& m = *z_.impl_;
  if (m.options.stage < 3) return;
  try {
    for (auto& u : m.units) m.startGather(u);
    for (size_t u = 0; u < m.units.size(); ++u) m.ensureGathered(u);
  } catch (...) {
    std::exception_ptr first = m.drain();
    for (auto& u : m.units) m.release(u);
    std::rethrow_exception(first ? first : std::current_exception());
  }
}

ZeroDataParallel::GatheredParameters::~GatheredParameters() {
  Impl& m = *z_.impl_;
  if (m.options.stage < 3) return;
  for (auto& u : m.units) m.release(u);
}

}  // namespace shoal::train::zero
