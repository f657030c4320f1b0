// Where to cut a model (a flat sequence of layers) into pipeline stages.
//
// The cost of a pipeline step is set by its slowest stage (every micro-batch passes through
// every stage), so the cut minimises the largest stage: an exact dynamic programme over the cut
// points, on measured forward+backward time (train/pipeline/profile.h) or on parameter counts
// (when memory, not time, is what must be balanced), or boundaries given by hand.
//
//   auto layers = shoal::train::pipeline::toLayerInfo(profileLayers(net, sample, 10));
//   auto plan = shoal::train::pipeline::planByTime(layers, stages);
//   std::cout << plan.describe();
//   // stage s runs layers [plan.boundaries[s], plan.boundaries[s + 1]) of net
//
// Interleaved pipelines (v chunks per rank): cut into p * v pieces (parts = p * v). Piece k is
// virtual stage k, i.e. chunk k / p of rank k % p (train/pipeline/schedule.h).
//
// Pure computation: no libtorch, no communication. Thread-compatible (values only).
// Errors: InvalidArgument (common/error.h), one line naming the offending value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::train::pipeline {

// Boundaries of a cut of n layers into p contiguous, non-empty parts: p + 1 indices,
// b[0] = 0 < b[1] < ... < b[p] = n; part s is layers [b[s], b[s + 1]).
using Boundaries = std::vector<int>;

// The cut of layers with these costs into `parts` parts whose largest sum is the smallest
// possible. Ties, deterministically: among the cuts that achieve it, the one with the smallest
// sum of squared part sums (the other parts as even as the bottleneck allows), evaluated as
// part0^2 + (part1^2 + (... + part_{p-1}^2)); among those, the lexicographically smallest
// boundaries (the earliest cuts). Part sums are differences of prefix sums
// (prefix[i + 1] = prefix[i] + cost[i]), computed the same way for every candidate, so equal
// inputs give the same cut and a brute force that evaluates candidates this way agrees.
// O(parts * n^2) time, O(parts * n) memory.
// InvalidArgument if parts < 1, parts > n, a cost is negative or not finite, or the costs sum
// to more than 1e150.
Boundaries balancedCuts(const std::vector<double>& cost, int parts);

// balancedCuts on parameter counts (each layer's number of parameter elements): balances the
// memory of weights, gradients and optimizer state. InvalidArgument as balancedCuts, and for a
// negative count.
Boundaries byParameters(const std::vector<int64_t>& params, int parts);

// Boundaries from the first layer of each stage, given by hand: firstLayerOfEachStage must
// start at 0, increase strictly and stay below `layers`. InvalidArgument naming the first
// offending entry otherwise (or layers < 1, or an empty list).
Boundaries fromBoundaries(const std::vector<int>& firstLayerOfEachStage, int layers);

// One layer as the partitioner sees it. Costs are per micro-batch of the size profiled.
struct LayerInfo {
  std::string name;
  int64_t parameters = 0;       // parameter elements
  double ms = 0;                // forward + backward, milliseconds
  int64_t activationBytes = 0;  // bytes of the layer's output
};

struct PartitionPlan {
  Boundaries boundaries;  // stages() + 1 indices into layers, as above
  std::vector<LayerInfo> layers;
  std::string method;  // "time", "parameters" or "manual"

  int stages() const { return static_cast<int>(boundaries.size()) - 1; }
  // Stage s's first layer and one past its last.
  int begin(int stage) const { return boundaries.at(stage); }
  int end(int stage) const { return boundaries.at(stage + 1); }
  // Sums over stage s's layers.
  double stageMs(int stage) const;
  int64_t stageParameters(int stage) const;
  // Bytes of all of stage s's layer outputs for one micro-batch: roughly what the stage keeps
  // per micro-batch in flight without activation checkpointing.
  int64_t stageActivationBytes(int stage) const;
  // Bytes of stage s's last layer's output: what it sends to the next stage per micro-batch.
  int64_t stageOutputBytes(int stage) const { return layers.at(end(stage) - 1).activationBytes; }
  // The slowest stage's time over the ideal (total time / stages); 1 is a perfect balance, 0
  // when every time is 0.
  double imbalance() const;

  // A table, one line per stage: index, first and last layer names, parameters, ms, activation
  // bytes kept and sent, then the slowest stage's ratio to the ideal. Ends with a newline.
  std::string describe() const;
};

// Plans over these layers: by measured time, by parameters, or from given first layers (the
// three functions above; InvalidArgument as they throw).
PartitionPlan planByTime(std::vector<LayerInfo> layers, int parts);
PartitionPlan planByParameters(std::vector<LayerInfo> layers, int parts);
PartitionPlan planFromBoundaries(std::vector<LayerInfo> layers,
                                 const std::vector<int>& firstLayerOfEachStage);

}  // namespace shoal::train::pipeline
