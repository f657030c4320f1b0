// Checkpoints of a model split over ranks: each shard (a pipeline stage, a stage's
// tensor-parallel slice) is saved by one rank of the replicas that hold it, sealed and atomic
// like every Shoal checkpoint (train/checkpoint.h), into <dir>/<shard name>, next to
// <dir>/layout, which records how the model was split.
//
// Resuming restores every shard at the newest step that every shard has (a crash between two
// shards' writes leaves one a step ahead: the older step is taken). A checkpoint written under
// another layout is refused with both layouts named. The number of replicas is not part of the
// layout: they hold the same parameters, so a job may resume with more or fewer of them.
//
// Collective over `world`: every rank calls save() and resumeLatest() with its own optimizer.
// Blocking, bounded by the groups' timeouts. Errors: SystemError when a write fails,
// InvalidArgument for a missing, corrupt or foreign checkpoint (one line naming the file).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "comm/group.h"
#include "train/checkpoint.h"

namespace shoal::train {

struct ShardPlace {
  std::shared_ptr<comm::Group> world;
  // The ranks holding the same shard (replica 0 writes and reads it; the others get it from it).
  std::shared_ptr<comm::Group> replicas;
  std::string shard;   // the shard's folder name, e.g. "stage-1" or "stage-1-tensor-0"
  std::string layout;  // one line: the split, the same on every rank
};

// The split recorded in <dir>/layout (the line save() writes, without its newline); nothing when
// the folder has no layout yet. Local, not collective: the caller decides which rank reads it.
// InvalidArgument naming the file when it is corrupt.
std::optional<std::string> readLayout(const std::string& dir);

class ShardedCheckpointer {
 public:
  // `module` (this rank's shard) must outlive the checkpointer.
  ShardedCheckpointer(std::string dir, int keep, ShardPlace place, torch::nn::Module& module);

  // Saves this rank's shard for progress.step. Returns the shard's file.
  std::string save(torch::optim::Optimizer& opt, const Progress& progress);

  // Loads the newest step every shard has into this rank's module and optimizer; nothing (and
  // no change) when no shard has a checkpoint yet.
  std::optional<Progress> resumeLatest(torch::optim::Optimizer& opt);

 private:
  std::string dir_;
  ShardPlace place_;
  torch::nn::Module& module_;
  Checkpointer shard_;
};

}  // namespace shoal::train
