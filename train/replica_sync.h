// What every data-parallel wrapper (DistributedDataParallel, ZeroDataParallel) does when it
// starts: check that every rank registered the same parameters and buffers, then give every
// rank rank 0's values.
//
// Collective over `group`: every rank calls them in the same order. Blocking, bounded by the
// group's timeout; a failed collective's error is thrown unchanged.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::train {

// MismatchError on every rank, naming the first difference and the rank that has it, when the
// ranks' (name, shape, dtype) lists of `params` and of the module's buffers differ. `who` starts
// the message ("DistributedDataParallel").
void checkSameParameters(comm::Group& group, const std::vector<std::string>& names,
                         const std::vector<torch::Tensor>& params, torch::nn::Module& module,
                         const std::string& who);

// Copies rank 0's values into `tensors` on every rank: one broadcast per dtype.
void broadcastFromRankZero(comm::Group& group, const std::vector<torch::Tensor>& tensors);

}  // namespace shoal::train
