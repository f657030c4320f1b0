#include "train/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/reduce.h"

namespace shoal::train {

namespace {

constexpr std::string_view kPrecisionNames[] = {"fp32", "bf16", "fp16"};

// out[i] = in[i] rounded to fp16 (nearest even; overflow to inf) and back; in may be out.
// Through a small buffer, a chunk at a time, with the CPU's widest conversion instructions
// (common/reduce.h: F16C where it has them, whatever the build's flags; a portable build's own
// conversion is a library call per element): libtorch's x.to(kHalf).to(kFloat) takes two
// passes and a temporary, and Fp16Weights and roundToHalf run it on every step.
void roundFloatsToHalf(const float* in, float* out, int64_t n) {
  constexpr int64_t kChunk = 4096;
  uint16_t half[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const auto m = static_cast<size_t>(std::min(kChunk, n - i));
    convertToHalf(in + i, half, m);
    convertFromHalf(half, out + i, m);
  }
}

// x rounded to fp16 and back, as a new tensor of x's dtype.
torch::Tensor roundedCopy(const torch::Tensor& x) {
  if (x.scalar_type() != torch::kFloat32) return x.to(torch::kHalf).to(x.scalar_type());
  const torch::Tensor in = x.contiguous();
  torch::Tensor out = torch::empty_like(in);
  roundFloatsToHalf(in.data_ptr<float>(), out.data_ptr<float>(), in.numel());
  return out;
}

void roundInPlace(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat32 && t.is_contiguous()) {
    roundFloatsToHalf(t.data_ptr<float>(), t.data_ptr<float>(), t.numel());
  } else {
    t.copy_(t.to(torch::kHalf));
  }
}

// g *= factor in place; returns whether g then holds an inf or nan. One pass for a contiguous
// float32 g (libtorch 1.13's isfinite alone is three passes and two temporaries).
bool scaleAndFindNonFinite(const torch::Tensor& g, double factor) {
  if (g.scalar_type() == torch::kFloat32 && g.is_contiguous() && !g.is_sparse()) {
    float* p = g.data_ptr<float>();
    const float f = static_cast<float>(factor);
    uint32_t bad = 0;
    for (int64_t i = 0, n = g.numel(); i < n; ++i) {
      const float v = p[i] * f;
      p[i] = v;
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);  // exponent all ones
    }
    return bad != 0;
  }
  g.mul_(factor);
  const torch::Tensor values = g.is_sparse() ? g._values() : g;
  return !torch::isfinite(values).all().item<bool>();
}

struct RoundToHalfFn : torch::autograd::Function<RoundToHalfFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return roundedCopy(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor& g = grads.at(0);
    return {g.defined() ? roundedCopy(g) : g};
  }
};

// Note [Autocast policy for norms]: the fp32 policy (CUDA autocast's for these ops): the input,
// weight and bias in fp32, the result in fp32; the next linear casts it back to bf16.
at::Tensor layerNormInFp32(const at::Tensor& input, at::IntArrayRef normalizedShape,
                           const c10::optional<at::Tensor>& weight,
                           const c10::optional<at::Tensor>& bias, double eps, bool cudnn) {
  c10::impl::ExcludeDispatchKeyGuard noAutocast(c10::DispatchKey::AutocastCPU);
  const auto cpu = c10::DeviceType::CPU;
  return at::layer_norm(at::autocast::cached_cast(at::kFloat, input, cpu), normalizedShape,
                        at::autocast::cached_cast(at::kFloat, weight, cpu),
                        at::autocast::cached_cast(at::kFloat, bias, cpu), eps, cudnn);
}

at::Tensor groupNormInFp32(const at::Tensor& input, int64_t groups,
                           const c10::optional<at::Tensor>& weight,
                           const c10::optional<at::Tensor>& bias, double eps, bool cudnn) {
  c10::impl::ExcludeDispatchKeyGuard noAutocast(c10::DispatchKey::AutocastCPU);
  const auto cpu = c10::DeviceType::CPU;
  return at::group_norm(at::autocast::cached_cast(at::kFloat, input, cpu), groups,
                        at::autocast::cached_cast(at::kFloat, weight, cpu),
                        at::autocast::cached_cast(at::kFloat, bias, cpu), eps, cudnn);
}

bool hasAutocastCpuKernel(const char* op) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(op, "").hasKernelForDispatchKey(
      c10::DispatchKey::AutocastCPU);
}

// Note [Autocast policy for norms]: once per process, and only for ops that have no CPU autocast
// kernel yet, so a libtorch that brings its own keeps it.
void registerNormPolicies() {
  // Never destroyed (the dispatcher is a process-wide static of libtorch's, and unregistering at
  // exit would race its own destruction), but reachable, so leak checkers do not count it.
  static torch::Library* library = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU,
                                 __FILE__, __LINE__);
    if (!hasAutocastCpuKernel("aten::layer_norm")) {
      library->impl("layer_norm", TORCH_FN(layerNormInFp32));
    }
    if (!hasAutocastCpuKernel("aten::group_norm")) {
      library->impl("group_norm", TORCH_FN(groupNormInFp32));
    }
  });
}

}  // namespace

Precision parsePrecision(std::string_view name) {
  for (size_t i = 0; i < std::size(kPrecisionNames); ++i) {
    if (kPrecisionNames[i] == name) return static_cast<Precision>(i);
  }
  SHOAL_THROW(InvalidArgument, "precision '{}': expected fp32, bf16 or fp16", name);
}

std::string_view toString(Precision precision) {
  const auto i = static_cast<size_t>(precision);
  return i < std::size(kPrecisionNames) ? kPrecisionNames[i] : "invalid";
}

// Note [What fp16 is on this CPU] in the header: libtorch 1.13 refuses kHalf as the CPU autocast
// dtype, so fp16 (like fp32) runs this region with autocast off.
AutocastGuard::AutocastGuard(Precision precision)
    : previousEnabled_(at::autocast::is_cpu_enabled()),
      previousDtype_(at::autocast::get_autocast_cpu_dtype()) {
  const bool on = precision == Precision::kBFloat16;
  if (on) {
    registerNormPolicies();
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  }
  at::autocast::set_cpu_enabled(on);
  // As torch.autocast does: the cache of cast weights lives as long as the outermost region.
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(previousEnabled_);
  at::autocast::set_autocast_cpu_dtype(previousDtype_);
}

torch::Tensor roundToHalf(const torch::Tensor& x) {
  if (x.scalar_type() != torch::kFloat32 && x.scalar_type() != torch::kFloat64) {
    SHOAL_THROW(InvalidArgument, "roundToHalf: tensor of {}, expected float32 or float64",
                c10::toString(x.scalar_type()));
  }
  return RoundToHalfFn::apply(x);
}

Fp16Weights::Fp16Weights(std::vector<torch::Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].scalar_type() != torch::kFloat32) {
      SHOAL_THROW(InvalidArgument, "Fp16Weights: parameter {} is {}, expected float32 masters", i,
                  c10::toString(params_[i].scalar_type()));
    }
  }
  masters_.resize(params_.size());
}

Fp16Weights::Scope Fp16Weights::scope() {
  if (inScope_) SHOAL_THROW(InvalidArgument, "Fp16Weights: a scope is already open");
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    if (!masters_[i].defined() || !masters_[i].sizes().equals(p.sizes())) {
      masters_[i] = torch::empty_like(p, torch::MemoryFormat::Preserve);
    }
    masters_[i].copy_(p);
    roundInPlace(p);
  }
  inScope_ = true;
  return Scope(this);
}

void Fp16Weights::leave() noexcept {
  if (!inScope_) return;
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    // In place: with DDP, .grad is a view into its bucket (Note [Gradients as bucket views]).
    const torch::Tensor& g = p.grad();
    if (g.defined() && g.layout() == torch::kStrided) roundInPlace(g);
    p.copy_(masters_[i]);
  }
  inScope_ = false;
}

LossScaler::LossScaler(Precision precision, LossScalerOptions options)
    : options_(options), enabled_(options.enabled.value_or(precision == Precision::kFloat16)) {
  const auto& o = options_;
  if (!(o.initScale > 0 && o.initScale <= std::numeric_limits<float>::max()) ||
      !(o.growthFactor > 1) || !(o.backoffFactor > 0 && o.backoffFactor < 1) ||
      o.growthInterval < 1) {
    SHOAL_THROW(InvalidArgument,
                "loss scaler: initial scale {} (0, fp32 max], growth factor {} (> 1), backoff "
                "factor {} (0, 1), growth interval {} (>= 1)",
                o.initScale, o.growthFactor, o.backoffFactor, o.growthInterval);
  }
  state_.scale = enabled_ ? o.initScale : 1.0;
}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const {
  return enabled_ ? loss * state_.scale : loss;
}

bool LossScaler::unscaleAndCheck(const std::vector<torch::Tensor>& params, const Groups& groups) {
  if (!enabled_) return false;
  if (unscaled_) {
    SHOAL_THROW(InvalidArgument,
                "LossScaler::unscaleAndCheck called twice since the last update(): the gradients "
                "would be divided by the scale again");
  }
  torch::NoGradGuard noGrad;
  // The scale is a power of two as long as its factors are: then the division is exact.
  const double inverse = 1.0 / state_.scale;
  bool found = false;
  for (const auto& p : params) {
    const torch::Tensor& g = p.grad();
    if (g.defined() && scaleAndFindNonFinite(g, inverse)) found = true;
  }
  // Note: every rank goes through every group whatever it found locally, so that the
  // collectives match; max over each group in turn is the max over their union.
  float flag = found ? 1.0f : 0.0f;
  for (const auto& group : groups) {
    if (group != nullptr && group->size() > 1) {
      comm::allreduce(*group, &flag, 1, DataType::kFloat32, ReduceOp::kMax);
    }
  }
  unscaled_ = true;
  foundInf_ = flag != 0.0f;
  return foundInf_;
}

void LossScaler::update(bool foundInf) {
  unscaled_ = false;
  foundInf_ = false;
  if (!enabled_) return;
  ++state_.steps;
  if (foundInf) {
    state_.scale *= options_.backoffFactor;
    state_.growthTracker = 0;
    ++state_.skippedSteps;
    return;
  }
  if (++state_.growthTracker >= options_.growthInterval) {
    const double grown = state_.scale * options_.growthFactor;
    if (grown <= std::numeric_limits<float>::max()) state_.scale = grown;
    state_.growthTracker = 0;
  }
}

bool LossScaler::step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                      const Groups& groups) {
  const bool foundInf = unscaled_ ? foundInf_ : unscaleAndCheck(params, groups);
  if (!foundInf) optimizer.step();
  update(foundInf);
  return !foundInf;
}

void LossScalerState::check() const {
  if (!(scale > 0 && std::isfinite(scale)) || growthTracker < 0 || skippedSteps < 0 ||
      steps < skippedSteps) {
    SHOAL_THROW(InvalidArgument,
                "loss scaler state: scale {}, growth tracker {}, skipped {} of {} steps", scale,
                growthTracker, skippedSteps, steps);
  }
}

void LossScaler::loadState(const LossScalerState& s) {
  s.check();
  state_ = s;
  unscaled_ = false;
  foundInf_ = false;
}

void LossScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("loss_scaler/scale", torch::tensor(state_.scale, torch::kFloat64));
  archive.write("loss_scaler/growth_tracker", torch::tensor(state_.growthTracker, torch::kInt64));
  archive.write("loss_scaler/skipped_steps", torch::tensor(state_.skippedSteps, torch::kInt64));
  archive.write("loss_scaler/steps", torch::tensor(state_.steps, torch::kInt64));
}

void LossScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker, skipped, steps;
  archive.read("loss_scaler/scale", scale);
  archive.read("loss_scaler/growth_tracker", tracker);
  archive.read("loss_scaler/skipped_steps", skipped);
  archive.read("loss_scaler/steps", steps);
  loadState({scale.item<double>(), tracker.item<int64_t>(), skipped.item<int64_t>(),
             steps.item<int64_t>()});
}

}  // namespace shoal::train
