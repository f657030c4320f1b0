// Sharded checkpoints for data parallelism with replicas (DistributedDataParallel): rank r of N
// writes the r-th 1/N of every parameter and of its optimizer state (rank 0 the buffers), in
// the format of train/reshard_checkpoint.h with the names of train/state_shards.h. Writing costs
// each rank 1/N of the bytes, and the checkpoint loads into DDP or any ZeRO stage at any world
// size, as a ZeRO checkpoint loads here.
//
// The optimizer must have been made over the module's trainable parameters in registration
// order (as makeOptimizer(module->parameters(), ...) does): state i is parameter i's.
//
// Collective over `group`: every rank calls with the same dir and step. Blocking, bounded by the
// group's timeout. Errors on every rank, one line: InvalidArgument for a missing, corrupt or
// foreign checkpoint (naming the file and the rank that wrote it) or an optimizer of another
// kind; SystemError when a write fails. Loading changes nothing unless every rank read all of it.
// The RNG is not part of these checkpoints (a job at another world size draws other streams).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "comm/group.h"
#include "train/checkpoint.h"
#include "train/ddp/comm_hook.h"
#include "train/optim.h"

namespace shoal::train {

// `hook`: DDP's communication hook; its state between steps (gradient compression's residuals)
// is saved with the rest (train/hook_checkpoint.h).
std::string saveDdpShards(comm::Group& group, const std::string& dir, torch::nn::Module& module,
                          torch::optim::Optimizer& opt, const OptimizerOptions& options,
                          const Progress& progress, int keep = 2,
                          const ddp::CommHook* hook = nullptr);

// The newest (or the given) step in dir; nothing when there is none. With `hook`, the hook's
// state is restored from the checkpoint too, after the buckets were made (a checkpoint without
// it, or with another kind's, leaves the hook as it is and says so in a warning on rank 0).
std::optional<Progress> loadDdpShards(comm::Group& group, const std::string& dir,
                                      torch::nn::Module& module, torch::optim::Optimizer& opt,
                                      const OptimizerOptions& options,
                                      std::optional<int64_t> step = {},
                                      ddp::CommHook* hook = nullptr);

}  // namespace shoal::train
