// Activation checkpointing (libtorch has no torch.utils.checkpoint): trade compute for memory by
// not keeping a function's intermediate activations for backward, and recomputing them when
// backward reaches the function.
//
//   auto y = shoal::train::checkpoint([&](const torch::Tensor& x) { return block(x); }, x);
//   // or, for a whole pipeline stage, per micro-batch:
//   shoal::train::Checkpointed stage(stageLayers);
//   auto out = stage(microBatch);
//   torch::autograd::backward({out}, {gradFromNextStage});
//
// How: a custom autograd function (torch::autograd::Function). Its forward runs `fn` without
// recording a graph and saves only the input; the graph then holds the input and the output,
// none of `fn`'s intermediates. When backward reaches it, it runs `fn` again with grad enabled
// on a detached copy of the input (requiring grad as the input did), backpropagates the
// incoming gradient through that recomputed graph, and returns the input's gradient. That
// inner backward is reentrant (PyTorch's use_reentrant=True checkpoint): `fn`'s parameters get
// their gradients there, accumulated into their .grad exactly as without checkpointing.
//
// Inputs that do not require grad (a first stage's images) still give gradients to `fn`'s
// parameters: the function cannot see them, so while grad mode is on the output is made to
// require grad by a zero-element anchor tensor that is a second input of the autograd function.
// If the recompute then yields an output that does not require grad (nothing in `fn` needs a
// gradient) backward does nothing and returns no gradient.
//
// Randomness (dropout): with preserveRng the CPU generator's state is saved before the forward
// runs `fn` and restored for the recompute, so the same masks are drawn; after the recompute the
// generator is put back to the state it had when backward reached the function, so checkpointing
// neither changes the caller's random stream nor the gradients. Only the CPU generator is
// covered: an input on another device with preserveRng is an InvalidArgument.
//
// Limits:
// - Parameters' gradients are accumulated into .grad by the inner backward even when the outer
//   call is torch::autograd::grad(), which PyTorch's reentrant checkpoint does too: use
//   backward(), the way training does.
// - `fn` must compute the same thing twice: the recompute's output shape and dtype are checked
//   against the forward's (InvalidArgument naming both); the values are not (a function whose
//   result depends on state that changed between forward and backward gets wrong gradients).
// - `fn` must not modify its input in place, and the input must not be modified in place
//   between forward and backward (libtorch's saved-variable version check reports that).
// - Under torch::NoGradGuard (evaluation, or the forward of an enclosing checkpoint) `fn` simply
//   runs: nothing would be saved anyway. So checkpoints nest.
//
// Threading: each call and its backward are independent (several micro-batches may be in flight
// and their backwards may run in any order). The CPU generator is process-wide: with preserveRng
// and several threads drawing random numbers concurrently, which numbers the forward drew is not
// defined, and the recompute's save/restore of the generator may interleave with the other
// threads' draws.
//
// Ownership: `fn` is copied into the graph and lives until the graph is freed (after backward,
// or when the output is dropped); whatever it references (a module) must live as long.
//
// Errors: InvalidArgument (one line) for an undefined input, an undefined output, preserveRng
// on a non-CPU input, and a recompute whose output differs in shape or dtype; it reaches the
// caller of checkpoint() or of backward(). Errors of `fn` itself propagate unchanged.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace shoal::train {

struct CheckpointOptions {
  // Save the CPU generator's state at forward and replay it in the recompute (see above). Off:
  // a function with dropout gets different masks in the recompute, hence wrong gradients.
  bool preserveRng = true;
};

using CheckpointFunction = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(input), without keeping fn's intermediate activations for backward (see above). Blocking:
// runs fn once now, and once more during backward.
torch::Tensor checkpoint(const CheckpointFunction& fn, const torch::Tensor& input,
                         CheckpointOptions options = {});

// A module whose forward checkpoints its child: wrap a pipeline stage (or any segment of a
// model) to keep only its input and output per micro-batch. The child is registered as the
// submodule "child", so parameters(), named_parameters(), to() and serialization see through
// the wrapper.
class CheckpointedImpl : public torch::nn::Module {
 public:
  explicit CheckpointedImpl(torch::nn::Sequential child, CheckpointOptions options = {});
  explicit CheckpointedImpl(torch::nn::AnyModule child, CheckpointOptions options = {});

  torch::Tensor forward(const torch::Tensor& input);

  const std::shared_ptr<torch::nn::Module>& child() const { return child_; }
  const CheckpointOptions& options() const { return options_; }

 private:
  std::shared_ptr<torch::nn::Module> child_;
  CheckpointFunction run_;
  CheckpointOptions options_;
};
TORCH_MODULE(Checkpointed);

}  // namespace shoal::train
