// What every tensor-parallel layer offers beyond torch::nn::Module: its full (one-process)
// parameters, gathered from the slices on every rank, under the names the one-process layer
// gives them. A checkpoint saved this way loads into the one-process model (train/gpt.h's
// gatherFullState), so a model trained with tensor parallelism can be taken away.
#pragma once

#include <torch/torch.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::train::tensor {

class ParallelLayer {
 public:
  virtual ~ParallelLayer() = default;
  // Collective over the layer's tensor group (every rank calls it, in the same order); blocking.
  // Each entry: the parameter's name in this module (as named_parameters(recurse=false) names
  // it) and the full tensor (detached).
  virtual std::vector<std::pair<std::string, torch::Tensor>> gatherFull() const = 0;
  // Whether this module's parameter `name` (as named_parameters(recurse=false) names it) is a
  // slice, different on each tensor rank, rather than whole and the same on every rank (a
  // row-parallel layer's bias): what a norm over the full model counts once or per rank. Pure.
  virtual bool sliced(std::string_view name) const = 0;
};

}  // namespace shoal::train::tensor
