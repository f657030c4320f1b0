// Checkpoints of a pipeline: each stage saves its own shard, sealed and atomic like every
// Shoal checkpoint (train/checkpoint.h), into <dir>/stage-<s> (written by replica 0 of the
// stage, the other replicas hold the same parameters), next to <dir>/layout, which records the
// cut (virtual stages, ranks, chunks, layer boundaries).
//
// Resuming restores every stage at the newest step that every stage has (a crash between two
// stages' writes leaves one stage a step ahead: the older step is taken). A checkpoint written
// under another split is refused with both layouts named (resharding to a new split is not
// supported).
//
// Collective over the pipeline's world: every rank calls save() and resume() with its own
// optimizer. Blocking, bounded by the groups' timeouts. Errors: SystemError when a write fails,
// InvalidArgument for a missing, corrupt or foreign checkpoint (one line naming the file).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "train/checkpoint.h"
#include "train/pipeline/pipeline.h"

namespace shoal::train::pipeline {

class StageCheckpointer {
 public:
  StageCheckpointer(std::string dir, int keep, Pipeline& pipeline);

  // Saves this stage's shard for progress.step. Returns this stage's file.
  std::string save(torch::optim::Optimizer& opt, const Progress& progress);

  // Loads the newest step every stage has into this rank's stage and optimizer; nothing (and no
  // change) when no stage has a checkpoint yet.
  std::optional<Progress> resumeLatest(torch::optim::Optimizer& opt);

 private:
  std::string layoutText() const;
  std::string dir_;
  Pipeline& pipeline_;
  Checkpointer shard_;
};

}  // namespace shoal::train::pipeline
