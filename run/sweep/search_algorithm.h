// The interface every search algorithm implements (grid_search.h, random_search.h,
// tpe_search.h), and the factory that picks one from the configuration.
//
// suggest() is deterministic: the same configuration, trial number and history give the same
// assignment, so a resumed sweep continues as the uninterrupted one would have (given the same
// history). Implementations are not thread-safe; the sweep calls them from one thread.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "run/sweep/search_space.h"

namespace shoal::run::sweep {

// A finished trial as the algorithms see it.
struct Observation {
  Assignment params;
  double value = 0;       // the metric at the last epoch the trial reported (NaN: failed)
  int epochs = 0;         // epochs it reported
  bool complete = false;  // ran to the end (false: stopped early by ASHA or a time limit)
  // No metric (crashed, diverged): ranked below every trial that reported one, so a search
  // learns to avoid where trials fail instead of returning there for want of data.
  bool failed = false;
};

class SearchAlgorithm {
 public:
  virtual ~SearchAlgorithm() = default;
  // The assignment for trial number `trial` (0, 1, ...), or nullopt when the algorithm has no
  // more points (a grid that is exhausted). `history`: every finished trial.
  virtual std::optional<Assignment> suggest(int trial, const std::vector<Observation>& history) = 0;
};

// The algorithm config.algorithm names, over config's space.
std::unique_ptr<SearchAlgorithm> makeSearchAlgorithm(const SweepConfig& config);

}  // namespace shoal::run::sweep
