// Shared by the sweep's search tests (sweep_test.cpp, sweep_tpe_multivariate_test.cpp): an
// algorithm run for a number of sequential trials on a cheap objective, and the median over
// seeds that their comparisons use.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "run/sweep/search_algorithm.h"
#include "run/sweep/search_space.h"

namespace shoal::test {

using SweepObjective = std::function<double(const run::sweep::Assignment&)>;

// The best (smallest) value found in `trials` sequential trials, every one completed before the
// next is suggested, and where given every suggestion made.
inline double bestOf(const run::sweep::SweepConfig& c, const SweepObjective& f, int trials,
                     std::vector<run::sweep::Assignment>* suggested = nullptr) {
  auto search = run::sweep::makeSearchAlgorithm(c);
  std::vector<run::sweep::Observation> history;
  double best = INFINITY;
  for (int k = 0; k < trials; ++k) {
    const run::sweep::Assignment a = *search->suggest(k, history);
    if (suggested != nullptr) suggested->push_back(a);
    const double v = f(a);
    history.push_back({a, v, 1, true});
    best = std::min(best, v);
  }
  return best;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace shoal::test
