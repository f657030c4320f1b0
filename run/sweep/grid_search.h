// Grid search: every combination of each parameter's grid values, in order (the last parameter
// varies fastest). A choice contributes all its values; an int range all its integers when they
// are at most grid_points, else grid_points of them spread evenly; a real range grid_points
// values from low to high inclusive (evenly on a log scale for log_uniform). Trial k is the
// k-th combination, whatever the history.
#pragma once

#include "run/sweep/search_algorithm.h"

namespace shoal::run::sweep {

// The values (Assignment coordinates) one parameter takes in the grid.
std::vector<double> gridValues(const Parameter& p);

class GridSearch : public SearchAlgorithm {
 public:
  // InvalidArgument when the grid has more than 10^7 points (a sweep never runs that many).
  explicit GridSearch(const SweepConfig& config);
  std::optional<Assignment> suggest(int trial, const std::vector<Observation>& history) override;
  size_t size() const { return size_; }

 private:
  std::vector<std::vector<double>> axes_;
  size_t size_ = 1;
};

}  // namespace shoal::run::sweep
