// Random search: each parameter drawn independently and uniformly over its internal range
// (search_space.h's toInternal: uniform on a log scale for log parameters, every integer of an
// int range equally likely, every choice equally likely). Trial k's draw depends only on the
// seed and k, never on the history.
#pragma once

#include "run/sweep/search_algorithm.h"
#include "run/sweep/sweep_random.h"

namespace shoal::run::sweep {

// One independent uniform draw of every parameter (also TPE's start-up trials).
Assignment sampleUniform(const SweepConfig& config, SweepRandom& random);

class RandomSearch : public SearchAlgorithm {
 public:
  explicit RandomSearch(const SweepConfig& config) : config_(config) {}
  std::optional<Assignment> suggest(int trial, const std::vector<Observation>& history) override;

 private:
  SweepConfig config_;
};

}  // namespace shoal::run::sweep
