// The data x pipeline process grid: `replicas` copies of a pipeline of `stages` ranks, as the
// pipeline sees it. makeGrid() lays it out on the world: world rank w is stage w % stages of
// replica w / stages, so one pipeline's stages are adjacent ranks (on one host when ranks fill
// hosts in order: its point-to-point traffic uses shared memory, while the replicas' all-reduce
// crosses hosts). train/process_grid.h makes one with a tensor dimension too, and in any layout
// (ProcessGrid::pipelineGrid()); nothing in a Grid assumes makeGrid's layout.
//
// makeGrid: collective over `world` (two Group::split calls); blocking, bounded by its timeout.
// InvalidArgument if stages < 1 or does not divide the world size. Leaves `tensor` null.
#pragma once

#include <memory>
#include <string>

#include "comm/group.h"

namespace shoal::train::pipeline {

struct Grid {
  std::shared_ptr<comm::Group> world;
  std::shared_ptr<comm::Group> pipe;  // this replica's stages, ranked by stage
  std::shared_ptr<comm::Group> data;  // this stage in every replica, ranked by replica
  int stages = 1;
  int replicas = 1;
  int stage = 0;    // = pipe->rank()
  int replica = 0;  // = data->rank()
  // The ranks that split each layer of this stage (train/process_grid.h), ranked by tensor
  // coordinate; every rank of `pipe` and `data` is tensor rank `tensorRank` of its own group.
  std::shared_ptr<comm::Group> tensor;  // null or size 1: no tensor parallelism
  int tensorRank = 0;                   // = tensor->rank() (0 without tensor parallelism)
  // "2 replicas x 2 stages; world rank 3 = replica 1, stage 1", with "x 2 tensor; ...,
  // tensor 1" under tensor parallelism.
  std::string describe() const;
};

Grid makeGrid(std::shared_ptr<comm::Group> world, int stages);

}  // namespace shoal::train::pipeline
