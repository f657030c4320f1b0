#include "train/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace shoal::train {
namespace {

std::string describeTensor(at::IntArrayRef sizes, at::ScalarType dtype) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "] " + c10::toString(dtype);
}

torch::Tensor cpuGeneratorState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setCpuGeneratorState(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Puts the CPU generator in `replay` for the scope, then back where it was: the recompute draws
// the forward's numbers and the caller's stream goes on as if no recompute had happened.
class ReplayCpuGenerator {
 public:
  explicit ReplayCpuGenerator(const torch::Tensor& replay) : callers_(cpuGeneratorState()) {
    setCpuGeneratorState(replay);
  }
  ~ReplayCpuGenerator() { setCpuGeneratorState(callers_); }
  ReplayCpuGenerator(const ReplayCpuGenerator&) = delete;
  ReplayCpuGenerator& operator=(const ReplayCpuGenerator&) = delete;

 private:
  torch::Tensor callers_;
};

// What backward needs besides the saved input. Held by the autograd context as a capsule
// (saved_data takes IValues only), so it lives exactly as long as the graph node.
struct RecomputeState : torch::CustomClassHolder {
  CheckpointFunction fn;
  CheckpointOptions options;
  torch::Tensor rngState;         // the CPU generator before the forward ran fn
  std::vector<int64_t> outSizes;  // the forward's output, to check the recompute against
  at::ScalarType outDtype = at::kFloat;
};

constexpr const char* kStateKey = "shoal.checkpoint";

struct CheckpointFunctionNode : torch::autograd::Function<CheckpointFunctionNode> {
  // `anchor` is a zero-element leaf requiring grad: it makes this node part of the graph when
  // the input does not require grad (see the header). Runs under grad mode off (apply() sets it).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& anchor, const CheckpointFunction& fn,
                               const CheckpointOptions& options) {
    auto state = c10::make_intrusive<RecomputeState>();
    state->fn = fn;
    state->options = options;
    if (options.preserveRng) state->rngState = cpuGeneratorState();
    torch::Tensor out;
    {
      torch::NoGradGuard noGrad;
      out = fn(input);
    }
    if (!out.defined()) SHOAL_THROW(InvalidArgument, "checkpoint: the function returned no tensor");
    state->outSizes = out.sizes().vec();
    state->outDtype = out.scalar_type();
    ctx->save_for_backward({input});
    ctx->saved_data[kStateKey] = c10::IValue::make_capsule(std::move(state));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradOutputs) {
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(
        ctx->saved_data.at(kStateKey).toCapsule());
    const torch::Tensor input = ctx->get_saved_variables().at(0);
    // A new leaf: the recompute's graph starts here, so the inner backward stops at it and its
    // .grad is the input's gradient.
    torch::Tensor leaf = input.detach();
    leaf.requires_grad_(input.requires_grad());

    torch::Tensor out;
    {
      std::optional<ReplayCpuGenerator> replay;
      if (state->options.preserveRng) replay.emplace(state->rngState);
      // The engine runs backward with grad mode off (no create_graph); the recompute must record.
      torch::AutoGradMode gradOn(true);
      out = state->fn(leaf);
    }
    if (!out.defined() || out.sizes() != at::IntArrayRef(state->outSizes) ||
        out.scalar_type() != state->outDtype) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint: the recompute in backward returned {} but the forward returned {}: "
                  "the checkpointed function must compute the same thing both times",
                  out.defined() ? describeTensor(out.sizes(), out.scalar_type()) : "no tensor",
                  describeTensor(state->outSizes, state->outDtype));
    }
    // Nothing in fn needs a gradient (no parameter requiring grad, input constant).
    if (out.requires_grad()) torch::autograd::backward({out}, {gradOutputs.at(0)});

    torch::Tensor inputGrad = input.requires_grad() ? leaf.grad() : torch::Tensor();
    // One per forward argument: input, anchor, fn, options.
    return {inputGrad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

std::shared_ptr<torch::nn::Module> modulePointer(const torch::nn::AnyModule& m) {
  if (m.is_empty()) SHOAL_THROW(InvalidArgument, "Checkpointed: the AnyModule holds no module");
  return m.ptr();
}

std::shared_ptr<torch::nn::Module> modulePointer(const torch::nn::Sequential& m) {
  if (m.is_empty()) SHOAL_THROW(InvalidArgument, "Checkpointed: the Sequential is empty (null)");
  return m.ptr();
}

}  // namespace

torch::Tensor checkpoint(const CheckpointFunction& fn, const torch::Tensor& input,
                         CheckpointOptions options) {
  if (!fn) SHOAL_THROW(InvalidArgument, "checkpoint: empty function");
  if (!input.defined()) SHOAL_THROW(InvalidArgument, "checkpoint: undefined input tensor");
  // No graph is being recorded (evaluation, or an enclosing checkpoint's forward): nothing to
  // save memory on, and the enclosing checkpoint's recompute will come back here with grad on.
  if (!torch::GradMode::is_enabled()) return fn(input);
  if (options.preserveRng && !input.device().is_cpu()) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint: preserveRng restores only the CPU generator but the input is on {}; "
                "pass CheckpointOptions{{.preserveRng = false}} if the function draws no random "
                "numbers",
                input.device().str());
  }
  torch::Tensor anchor = torch::empty({0}, input.options().dtype(torch::kFloat));
  anchor.requires_grad_(true);
  return CheckpointFunctionNode::apply(input, anchor, fn, options);
}

CheckpointedImpl::CheckpointedImpl(torch::nn::Sequential child, CheckpointOptions options)
    : child_(modulePointer(child)),
      run_([child](const torch::Tensor& x) mutable { return child->forward(x); }),
      options_(options) {
  register_module("child", child_);
}

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule child, CheckpointOptions options)
    : child_(modulePointer(child)),
      run_([child](const torch::Tensor& x) mutable { return child.forward(x); }),
      options_(options) {
  register_module("child", child_);
}

torch::Tensor CheckpointedImpl::forward(const torch::Tensor& input) {
  return checkpoint(run_, input, options_);
}

}  // namespace shoal::train
