// One parameter's optimizer state as named tensors, independent of the optimizer's class: what a
// sharded checkpoint writes per parameter (or per shard of one) and reads back into an optimizer
// of the same type.
//
// Keys per optimizer (libtorch's names):
//   SGD          momentum_buffer
//   Adam, AdamW  exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad), and the step count
//   RMSprop      square_avg, momentum_buffer (momentum > 0), grad_avg (centered), step count
//   Lamb         exp_avg, exp_avg_sq, step count                          (train/optim/lamb.h)
//   Lars         momentum_buffer (momentum > 0)                           (train/optim/lars.h)
// Types without a step count report and expect step 0.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shoal::train {

// One parameter's optimizer state as tensors shaped like the parameter (elementwise state) plus
// its step count.
struct ParamState {
  int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

// The state of the optimizer's parameter `index` (flattened over param groups, in order); the
// tensors alias the optimizer's (no copy). nullopt when the optimizer holds no state for it yet
// (e.g. before the first step). InvalidArgument for an index out of range or an optimizer type
// not listed above. Not thread-safe with a concurrent step().
std::optional<ParamState> exportState(torch::optim::Optimizer& opt, size_t index);

// Creates or replaces that state from copies of the tensors. InvalidArgument (one line) naming
// the key when a name is unknown for this optimizer type, repeated, missing while this
// parameter's settings need it, or its shape or dtype differs from the parameter's; also for an
// index out of range, a negative step or an unsupported optimizer type. Nothing changes when it
// throws.
void importState(torch::optim::Optimizer& opt, size_t index, const ParamState& state);

// Drops parameter `index`'s state, as before its first step. InvalidArgument for an index out
// of range.
void clearState(torch::optim::Optimizer& opt, size_t index);

// Every parameter's state at once: states[i] imported, or parameter i's cleared where it is
// nothing. All or nothing: InvalidArgument (naming the parameter, then importState's reason)
// when one does not fit, or for an optimizer type not listed above, and then every parameter
// keeps what it held. Parameters past states.size() are left alone.
void replaceStates(torch::optim::Optimizer& opt,
                   const std::vector<std::optional<ParamState>>& states);

}  // namespace shoal::train
