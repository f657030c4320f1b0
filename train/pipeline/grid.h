// The data x pipeline process grid: `replicas` copies of a pipeline of `stages` ranks. World
// rank w is stage w % stages of replica w / stages, so one pipeline's stages are adjacent ranks
// (on one host when ranks fill hosts in order: its point-to-point traffic uses shared memory,
// while the replicas' all-reduce crosses hosts).
//
// Collective over `world` (two Group::split calls); blocking, bounded by its timeout.
// InvalidArgument if stages < 1 or does not divide the world size.
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
  // The world rank of `stage` in this rank's replica.
  int worldRankOfStage(int s) const { return replica * stages + s; }
  // "2 replicas x 2 stages; world rank 3 = replica 1, stage 1".
  std::string describe() const;
};

Grid makeGrid(std::shared_ptr<comm::Group> world, int stages);

}  // namespace shoal::train::pipeline
