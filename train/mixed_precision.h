// Mixed precision on the CPU: bf16 compute through libtorch's CPU autocast, fp16 through an
// emulation (fp16 values, fp32 arithmetic), fp32 master weights and optimizer state in both, and
// dynamic loss scaling for fp16.
//
//   shoal::train::LossScaler scaler(precision);            // enabled for fp16 only
//   shoal::train::Fp16Weights half(model->parameters());   // used with fp16 only
//   auto opt = makeOptimizer(model->parameters(), ...);     // fp32 parameters, fp32 state
//   for (...) {
//     opt->zero_grad();
//     {
//       std::optional<Fp16Weights::Scope> fp16;
//       if (precision == Precision::kFloat16) fp16.emplace(half.scope());
//       torch::Tensor loss;
//       {
//         AutocastGuard autocast(precision);                 // bf16: linears, convs in bf16
//         loss = lossFn(model->forward(x), y);
//       }
//       ddp.backward(scaler.scale(loss));                   // or scaler.scale(loss).backward()
//     }                                                     // fp16: gradients rounded to fp16
//     scaler.step(*opt, model->parameters(), {dataGroup});  // unscale, skip on inf, update
//   }
//
// Note [What fp16 is on this CPU]
// libtorch 1.13 has no fp16 compute on the CPU: set_autocast_cpu_dtype(kHalf) is refused
// ("AutocastCPU only support Bfloat16"), and mm / addmm / bmm, softmax, log_softmax, layer_norm,
// relu, gelu, tanh and conv2d have no Half kernel ("addmm_impl_cpu_" not implemented for 'Half');
// only casts, add, sum, isinf and embedding run. So fp16 mode keeps fp32 kernels and puts every
// value that an fp16 GPU run would store in fp16 through an fp16 rounding, which is what makes its
// numerics (and its overflows) those of fp16, not its speed:
// - weights: inside an Fp16Weights scope the model's parameters hold their fp16 roundings (the
//   "fp16 model copy"); outside it they hold the fp32 master values, which the optimizer owns;
// - weight gradients: at the scope's end each .grad is rounded to fp16 in place, so a gradient
//   beyond 65504 becomes inf (the overflow loss scaling exists for) and one below 6e-8 becomes 0
//   (the underflow it prevents);
// - activations and their gradients, where a model asks for it: roundToHalf(x) rounds the value
//   in forward and the gradient in backward.
// Each op computes in fp32 between those roundings, as fp16 matmuls with fp32 accumulation do on
// a GPU. It costs time instead of saving it (bench/results/mixed_precision.md has the numbers).
// With DistributedDataParallel the gradients are rounded after the average, not before it (a
// GPU would all-reduce fp16 values): an overflow still propagates, since inf averages to inf.
//
// Note [Where autocast goes]
// AutocastGuard covers the forward and the loss; backward and optimizer.step() go outside it
// (backward then runs each op in the dtype its forward chose). Autocast caches the bf16 copy of
// each weight while its outermost guard lives, so the weights must not change inside it: a
// guard around several forwards of one step (micro-batches) casts each weight once;
// optimizer.step() inside it would leave stale copies. A pipeline (train/pipeline/pipeline.h)
// interleaves forwards and backwards inside step(), so there the guard goes around the
// Pipeline's construction (its plan then records the bf16 activations that cross stages) and
// around each step(); backward under autocast computes the same gradients here, since each
// backward op already gets its inputs in the dtypes forward chose. libtorch's autocast state is
// per thread: each thread that computes needs its own guard.
//
// Threading: every object here belongs to one training thread. LossScaler's agreement on a
// skipped step is collective over the groups it is given (see unscaleAndCheck()).
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/group.h"

namespace shoal::train {

enum class Precision : uint8_t { kFloat32, kBFloat16, kFloat16 };

// "fp32", "bf16", "fp16"; anything else is an InvalidArgument naming the choices.
Precision parsePrecision(std::string_view name);
std::string_view toString(Precision precision);

// libtorch's CPU autocast for the guard's lifetime: on in bf16 with kBFloat16, off with kFloat32
// and kFloat16 (so a guard also switches autocast off inside an autocast region, for an op that
// must run in fp32). The previous state (on/off, dtype) is restored at the end, and the cast
// cache cleared when the outermost guard of the thread ends. Inside a bf16 guard, matmuls,
// linears and convolutions run in bf16 and return bf16; the losses (cross_entropy, nll_loss,
// mse_loss), layer_norm and group_norm run in fp32; other ops (relu, softmax, batch_norm, adds)
// run in the dtype they are given; parameters stay fp32 (autocast casts copies). Per thread; not
// copyable.
//
// Note [Autocast policy for norms]
// libtorch 1.13's CPU autocast has no rule for layer_norm and group_norm, and their CPU kernels
// refuse a bf16 input with fp32 weights ("expected scalar type BFloat16 but found Float"), so a
// model with a LayerNorm (train/residual_mlp.h) fails under plain autocast. The first bf16 guard
// of the process registers CUDA autocast's rule for them on the AutocastCPU dispatch key: input,
// weight and bias cast to fp32, result fp32. Only where libtorch has no such kernel of its own.
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool previousEnabled_;
  at::ScalarType previousDtype_;
};

// x rounded to fp16 and back, as a differentiable op whose backward rounds the incoming gradient
// the same way (|v| > 65504 → ±inf, |v| < 6e-8 → 0, 11 significant bits): the fp16 emulation's
// activation boundary (Note [What fp16 is on this CPU]). Keeps x's dtype; x must be float32 or
// float64 (InvalidArgument otherwise).
torch::Tensor roundToHalf(const torch::Tensor& x);

// fp16 mode's model copy (Note [What fp16 is on this CPU]): while a Scope lives, the parameters
// hold their fp16 roundings and the fp32 values wait in a copy kept here; when it ends, every
// defined .grad is rounded to fp16 in place (an inf there is what LossScaler then finds) and
// the fp32 values are written back, so the optimizer, checkpoints and DDP's construction-time
// broadcast only ever see fp32 masters. The scope must span forward AND backward (autograd saved
// the parameters themselves for backward). Parameters keep their identity (in-place writes), so
// DDP's bucket views and the optimizer's references stay valid. The fp32 copy is taken when each
// scope begins, so between scopes the parameters may change freely (optimizer steps, a
// checkpoint load, DDP's broadcast); inside one only autograd may touch them.
// Threading: the training thread. Not copyable.
class Fp16Weights {
 public:
  // The float32 parameters to round (InvalidArgument for another dtype).
  explicit Fp16Weights(std::vector<torch::Tensor> params);
  Fp16Weights(const Fp16Weights&) = delete;
  Fp16Weights& operator=(const Fp16Weights&) = delete;

  class Scope {
   public:
    ~Scope() {
      if (weights_ != nullptr) weights_->leave();
    }
    Scope(Scope&& other) noexcept : weights_(std::exchange(other.weights_, nullptr)) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    friend class Fp16Weights;
    explicit Scope(Fp16Weights* w) : weights_(w) {}
    Fp16Weights* weights_;
  };
  // Starts the fp16 window. InvalidArgument if one is already open.
  Scope scope();
  bool inScope() const { return inScope_; }

 private:
  void leave() noexcept;

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;  // the fp32 values while a scope lives
  bool inScope_ = false;
};

// Dynamic loss scaling, as torch.cuda.amp.GradScaler does it.
struct LossScalerOptions {
  // Unset: on for fp16, off for fp32 and bf16 (whose range is fp32's).
  std::optional<bool> enabled;
  double initScale = 65536.0;     // 2^16
  double growthFactor = 2.0;      // > 1
  double backoffFactor = 0.5;     // in (0, 1)
  int64_t growthInterval = 2000;  // good steps in a row before the scale grows
};

// What a checkpoint keeps of a LossScaler.
struct LossScalerState {
  double scale = 1.0;
  int64_t growthTracker = 0;  // good steps since the last growth or skip
  int64_t skippedSteps = 0;
  int64_t steps = 0;  // update() calls while enabled: steps taken + skipped
  // InvalidArgument unless a scaler could be in it (a positive, finite scale; counts that fit).
  void check() const;
};

// Multiplies the loss by a scale before backward, divides the gradients by it afterwards,
// skips the optimizer step when a gradient is inf or nan on any rank (then halves the scale),
// and doubles the scale after growthInterval good steps in a row. Disabled: scale 1, no checks,
// never skips, no communication. Threading: the training thread. Not copyable.
class LossScaler {
 public:
  // InvalidArgument for options out of range.
  explicit LossScaler(Precision precision, LossScalerOptions options = {});
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  using Groups = std::vector<std::shared_ptr<comm::Group>>;

  // loss * scale (the loss itself when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;

  // Divides every defined .grad of `params` by the scale in place and returns whether any of
  // them holds an inf or nan on any rank of `groups`: one max all-reduce of a 0/1 flag per group
  // (null entries skipped), in the order given, so every rank must pass the same groups in the
  // same order (e.g. {tensor, pipeline, data}: together they cover the grid, so every rank of it
  // skips the same step). Collective, blocking, bounded by each group's timeout; throws what the
  // all-reduce throws (TimeoutError, PeerError, MismatchError). Disabled: returns false at once.
  // At most once between two update() calls (InvalidArgument otherwise): the gradients would be
  // divided twice.
  bool unscaleAndCheck(const std::vector<torch::Tensor>& params, const Groups& groups);

  // Ends a step: after an inf, scale *= backoffFactor and the step counts as skipped; after
  // growthInterval good steps in a row, scale *= growthFactor (unless that would pass fp32's
  // largest value, since the scaled loss is fp32). No-op when disabled.
  void update(bool foundInf);

  // unscaleAndCheck() (unless already called this step), then optimizer.step() only if no rank
  // found an inf, then update(). Returns whether the optimizer stepped. Collective as
  // unscaleAndCheck().
  bool step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params,
            const Groups& groups);

  bool enabled() const { return enabled_; }
  double currentScale() const { return state_.scale; }
  int64_t skippedSteps() const { return state_.skippedSteps; }
  int64_t growthTracker() const { return state_.growthTracker; }
  int64_t steps() const { return state_.steps; }
  const LossScalerOptions& options() const { return options_; }

  // For checkpoints: the state, and back (InvalidArgument for a non-positive or non-finite
  // scale or negative counters). save/load write and read "loss_scaler/..." keys in a libtorch
  // archive next to the model and optimizer (load throws libtorch's error for missing keys).
  LossScalerState state() const { return state_; }
  void loadState(const LossScalerState& state);
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  LossScalerOptions options_;
  bool enabled_;
  LossScalerState state_;
  bool unscaled_ = false;  // unscaleAndCheck() ran since the last update()
  bool foundInf_ = false;  // its answer
};

}  // namespace shoal::train
