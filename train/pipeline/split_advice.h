// A better pipeline split, from what training measured: the plan cut the model by costs profiled
// before training (or by parameters, or by hand); the stages' real compute times per step can
// differ (other batch statistics, caches, a busy core). This redistributes each stage's measured
// time over its layers in proportion to their profiled costs (evenly when they were not
// profiled), cuts those costs again with the exact partitioner (train/pipeline/partition.h) and
// says whether the new cut is worth a restart.
//
//   auto advice = adviseSplit(layerMs, plan.boundaries, measuredMsPerStage);
//   std::cout << advice.describe();   // the times, the slowest stage, a suggested split
//
// Interleaved pipelines (v chunks per rank) are advised over their virtual stages: the cut is
// of all p * v of them, and what it is judged by is each rank's load, the sum of its chunks'
// times (chunk c of rank r is virtual stage c * p + r), since a rank runs its chunks in turn.
//
// Pure computation: no libtorch, no communication. Thread-compatible (values only).
// Errors: InvalidArgument (one line) when the sizes do not match (a cost per layer, a
// measurement per stage, boundaries of those stages over those layers) or a value is negative
// or not finite.
#pragma once

#include <string>
#include <vector>

#include "train/pipeline/partition.h"

namespace shoal::train::pipeline {

struct SplitAdvice {
  std::vector<double> measuredMs;  // per (virtual) stage, per step
  int chunks = 1;                  // per rank: measuredMs.size() / chunks ranks
  Boundaries current;              // the split measured
  Boundaries suggested;            // the cut of the rescaled costs (== current when no better)
  double currentSlowestMs = 0;     // the slowest rank's measured load (sum of its chunks)
  double suggestedSlowestMs = 0;   // the suggested cut's slowest rank, estimated
  // Worth changing: the estimate is at least 5% below the measured slowest stage (smaller gains
  // are within the noise of the measurement).
  bool better() const { return suggestedSlowestMs < 0.95 * currentSlowestMs; }
  // "pipeline stages measured 3.1, 5.2 ms per step (slowest: stage 1, 1.25 x the mean); a
  // split at layers 0, 6, 13 would make the slowest about 4.3 ms: boundaries {6}", or that
  // the current split is as good as any.
  std::string describe() const;
};

// `layerMs`: the profiled cost of each layer (all 0: not profiled); `current`: the stages'
// boundaries over those layers; `measuredMs`: each stage's compute time per step; `chunks`: per
// rank (measuredMs then holds virtual stages, and its size must be a multiple of chunks).
SplitAdvice adviseSplit(const std::vector<double>& layerMs, const Boundaries& current,
                        const std::vector<double>& measuredMs, int chunks = 1);

// Each rank's load: the sum of its chunks' entries of `perVirtualStage` (p * chunks of them).
std::vector<double> rankLoads(const std::vector<double>& perVirtualStage, int chunks);

}  // namespace shoal::train::pipeline
