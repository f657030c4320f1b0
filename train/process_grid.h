// The data x pipeline x tensor process grid: `data` replicas of a pipeline of `pipeline` stages,
// each stage's layers split over `tensor` ranks, with one sub-group per dimension.
//
//   auto grid = train::makeProcessGrid(world.group, {.pipeline = 2, .tensor = 2});
//   std::cout << grid.describe() << "\n";   // data = world / 4
//   auto pipe = pipeline::Pipeline(model, grid.pipelineGrid(), ...);
//
// Layout: `order` lists the dimensions from the fastest-varying (adjacent world ranks) to the
// slowest. The default "tensor,pipeline,data" keeps a stage's tensor-parallel ranks adjacent
// (one host when ranks fill hosts in order: their per-layer all-reduces use shared memory),
// then a replica's stages (point-to-point, as in train/pipeline/grid.h), and spreads the
// replicas, whose one gradient all-reduce per step crosses hosts. With order (a, b, c) of
// sizes (A, B, C), world rank w has a = w % A, b = (w / A) % B, c = w / (A * B).
//
// Each sub-group holds the ranks that differ only in its coordinate, ranked by it: `tensor` by
// tensor coordinate, `pipe` by stage, `data` by replica. A dimension of size 1 still has its
// group (of one rank), so code never tests for null.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/group.h"
#include "train/pipeline/grid.h"

namespace shoal::train {

struct ProcessGridOptions {
  int data = 0;  // 0: world size / (pipeline * tensor)
  int pipeline = 1;
  int tensor = 1;
  // The three names "tensor", "pipeline", "data", comma-separated, fastest-varying first; any
  // permutation (spaces around the names are ignored).
  std::string order = "tensor,pipeline,data";
};

struct ProcessGrid {
  std::shared_ptr<comm::Group> world;
  std::shared_ptr<comm::Group> tensor;  // this rank's stage slice in this replica: tensor ranks
  std::shared_ptr<comm::Group> pipe;    // this replica's stages at this tensor rank
  std::shared_ptr<comm::Group> data;    // this (stage, tensor rank) in every replica
  int dataSize = 1;
  int pipelineSize = 1;
  int tensorSize = 1;
  int dataRank = 0;      // = data->rank(): the replica
  int pipelineRank = 0;  // = pipe->rank(): the stage
  int tensorRank = 0;    // = tensor->rank()
  std::string order;     // normalized: "tensor,pipeline,data" (no spaces)

  // The world rank at those coordinates (InvalidArgument if one is out of range). Pure.
  int worldRankOf(int data, int pipeline, int tensor) const;
  // "grid data 2 x pipeline 2 x tensor 2 (order tensor,pipeline,data); world rank 5 = data 1,
  // stage 0, tensor 1".
  std::string describe() const;
  // The pipeline's view of this rank (train/pipeline/grid.h): stages = pipelineSize, replicas
  // = dataSize, and the tensor group. Shares this grid's groups; makes none.
  pipeline::Grid pipelineGrid() const;
};

// Collective over `world`: three Group::split calls (tensor, pipeline, data, in that order on
// every rank); blocking, each bounded by the world's timeout, and throwing what Group::split
// throws. Validates before any split, so every rank (given the same options) throws the same
// InvalidArgument: a size below 1 (data below 0), data x pipeline x tensor not equal to the
// world size (data = 0: pipeline x tensor not dividing it), or an order that is not a
// permutation of the three names.
ProcessGrid makeProcessGrid(std::shared_ptr<comm::Group> world,
                            const ProcessGridOptions& options = {});

// For model code checking its shapes against the grid before training: throws InvalidArgument
// "tensor parallelism: 6 attention heads do not divide over tensor 4" unless `size` divides
// `value` (`what` names the value's unit, `dim` the grid dimension). Also InvalidArgument if
// size < 1. Pure.
void requireDivisible(std::string_view what, int64_t value, std::string_view dim, int size);

}  // namespace shoal::train
