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
#include "train/ddp.h"
#include "train/optim.h"

namespace shoal::train {

// `ddp`: the DistributedDataParallel over `module`, if any. Its hook's state between steps
// (gradient compression's residuals: train/hook_checkpoint.h) and its bucket order are saved
// with the rest.
std::string saveDdpShards(comm::Group& group, const std::string& dir, torch::nn::Module& module,
                          torch::optim::Optimizer& opt, const OptimizerOptions& options,
                          const Progress& progress, int keep = 2,
                          DistributedDataParallel* ddp = nullptr);

// The newest (or the given) step in dir; nothing when there is none. With `ddp`, its bucket
// order (meta "ddp_bucket_order", when the checkpoint's world size is this one's) and then its
// hook's state are restored too: a resumed job encodes the buckets the job that saved it did,
// with the same residuals. A checkpoint without hook state, or with another kind's, leaves the
// hook as it is and says so in a warning on rank 0.
std::optional<Progress> loadDdpShards(comm::Group& group, const std::string& dir,
                                      torch::nn::Module& module, torch::optim::Optimizer& opt,
                                      const OptimizerOptions& options,
                                      std::optional<int64_t> step = {},
                                      DistributedDataParallel* ddp = nullptr);

}  // namespace shoal::train
