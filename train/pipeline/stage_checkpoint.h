// Checkpoints of a pipeline (train/sharded_checkpoint.h): each stage saves its own shard into
// <dir>/stage-<s> (with tensor parallelism, each slice into <dir>/stage-<s>-tensor-<t>), written
// by replica 0 of the stage (the other replicas hold the same parameters), next to <dir>/layout,
// which records the cut (virtual stages, ranks, chunks, layer boundaries, tensor size).
//
// Resuming restores every stage at the newest step that every stage has (a crash between two
// stages' writes leaves one stage a step ahead: the older step is taken). A checkpoint written
// under another split is refused with both layouts named (resharding to a new split is not
// supported; train/full_state.h gathers the whole model for one process).
//
// Collective over the pipeline's world: every rank calls save() and resume() with its own
// optimizer. Blocking, bounded by the groups' timeouts. Errors: SystemError when a write fails,
// InvalidArgument for a missing, corrupt or foreign checkpoint (one line naming the file).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/checkpoint.h"
#include "train/pipeline/pipeline.h"
#include "train/sharded_checkpoint.h"

namespace shoal::train::pipeline {

// Where this rank's stage shard goes, and the pipeline's layout line.
ShardPlace shardPlace(const Pipeline& pipeline);

// The cut that <dir>/layout records, as PipelineOptions::boundaries (the first layer of each
// virtual stage after the first), when it was written by a pipeline of `stages` ranks x
// `chunks`; nothing when there is no layout or it records another shape (the resume then
// refuses it, naming both). Why: a time-balanced split is measured anew by each run and a loaded
// machine measures another cut, so a resumed run takes the one its checkpoints were written
// with. Collective over `world`: rank 0 reads the file (where the layout is checked), every
// rank gets its answer. InvalidArgument for a layout file that is corrupt.
std::optional<std::vector<int>> savedBoundaries(comm::Group& world, const std::string& dir,
                                                int stages, int chunks);

class StageCheckpointer {
 public:
  StageCheckpointer(std::string dir, int keep, Pipeline& pipeline);

  // Saves this stage's shard for progress.step. Returns this stage's file.
  std::string save(torch::optim::Optimizer& opt, const Progress& progress);

  // Loads the newest step every stage has into this rank's stage and optimizer; nothing (and no
  // change) when no stage has a checkpoint yet.
  std::optional<Progress> resumeLatest(torch::optim::Optimizer& opt);

 private:
  ShardedCheckpointer shards_;
};

}  // namespace shoal::train::pipeline
