// The names a sharded checkpoint (train/reshard_checkpoint.h) gives a training job's state, and
// reading it back into pieces of any size, so that DDP and every ZeRO stage write the same
// thing and each reads what any of them wrote, at any world size:
//   param/<name>             the parameter (ZeRO: its fp32 master)
//   optim/<key>/<name>       the optimizer's elementwise state of it (train/optimizer_state.h)
//   buffer/<name>            a module buffer (written whole by rank 0)
// and in the meta: the progress, the optimizer kind and its step count, who wrote it.
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train::shards {

std::string paramKey(const std::string& name);
std::string stateKey(const std::string& key, const std::string& name);
std::string bufferKey(const std::string& name);

// The state keys the checkpoint holds for parameter `name` ("exp_avg", ...), sorted.
std::vector<std::string> stateKeysOf(const ShardReader& reader, const std::string& name);
// The same among `names` (tensor names of a state held in memory).
std::vector<std::string> stateKeysOf(const std::vector<std::string>& names,
                                     const std::string& name);

// The meta of a training job's checkpoint; "modules" lists the module's submodules, those
// without tensors too, so that consolidate() writes the nesting torch::load expects.
std::map<std::string, std::string> meta(torch::nn::Module& module, const Progress& progress,
                                        const OptimizerOptions& opt, int64_t optimizerStep,
                                        const std::string& writer);
// The meta's `key` as a count (a non-negative integer); InvalidArgument naming the step and the
// key when it is missing or not one.
int64_t metaCount(const ShardReader& reader, const std::string& key);
Progress progressOf(const ShardReader& reader);
int64_t optimizerStepOf(const ShardReader& reader);

// Elements [offset, offset + out.numel()) of the checkpoint's tensor `key` into `out` (any
// floating dtype: converted). InvalidArgument naming the key when the checkpoint lacks it or
// holds it with another shape than `shape` (another model), and the reader's errors.
void readInto(const ShardReader& reader, const std::string& key, const std::vector<int64_t>& shape,
              int64_t offset, torch::Tensor out);

// The step to load: `step` if given, else the newest committed one in dir (nothing: none).
// Collective over `group`: every rank must see the same one (InvalidArgument otherwise: the
// folder is not shared), and a corrupt newest manifest fails every rank
// (train/collective_verdict.h).
std::optional<int64_t> agreeOnStep(comm::Group& group, const std::string& dir,
                                   std::optional<int64_t> step);

// Checks that the optimizer kind the checkpoint was written with is `opt`'s (its state would not
// fit another's).
void checkOptimizer(const ShardReader& reader, const OptimizerOptions& opt);

}  // namespace shoal::train::shards
