// The tree-structured Parzen estimator (Bergstra et al., 2011), the algorithm of Hyperopt and
// Optuna's default sampler.
//
// How a suggestion is made:
//   1. Until tpe.startup_trials trials have a metric, draw uniformly (random_search.h).
//   2. Rank the history best first: trials that ran to the end by their metric, then those
//      stopped early (by ASHA: fewer epochs rank lower, then by their last metric), then those
//      that failed without a metric (so l/g steers away from where trials crash). The best
//      ceil(gamma * n) (at least 1, at most 25) are "good", the rest "bad".
//   3. Per parameter, independently, fit two densities over its internal coordinates
//      (search_space.h): l(x) from the good trials, g(x) from the bad. A numeric parameter gets
//      a Parzen window: a Gaussian at each observation plus one broad prior Gaussian at the
//      range's centre, each truncated to the range; a point's bandwidth is the larger distance
//      to its neighbours, clipped to [range / min(100, n + 1), range]. A choice gets smoothed
//      counts: (count + 1) / (n + k) over its k values.
//   4. Per parameter, draw tpe.candidates values from its l and keep the one with the largest
//      log l(x) - log g(x): the expected improvement's maximiser under TPE's model, which
//      factorises over parameters (so each is chosen on its own, as in Hyperopt).
// Deterministic: the generator is seeded from (seed, trial number) alone.
//
// Steps 1 and 2 are shared with the multivariate variant (tpe_multivariate.h), which replaces
// steps 3 and 4 by one joint density over all parameters.
#pragma once

#include "run/sweep/search_algorithm.h"
#include "run/sweep/sweep_random.h"

namespace shoal::run::sweep {

// Step 2: the history ranked best first and cut into the good and the bad trials.
struct TpeSplit {
  std::vector<const Observation*> good, bad;
};
TpeSplit splitHistory(const SweepConfig& config, const std::vector<Observation>& history);

// A one-dimensional Parzen estimator over [low, high]: a mixture of truncated Gaussians.
class ParzenEstimator {
 public:
  // `points` in [low, high] (internal coordinates), low < high.
  ParzenEstimator(const std::vector<double>& points, double low, double high);
  double sample(SweepRandom& random) const;
  double logDensity(double x) const;

 private:
  double low_, high_;
  std::vector<double> mus_, sigmas_, logNorms_;  // logNorms_: log of each truncated mass
};

class TpeSearch : public SearchAlgorithm {
 public:
  explicit TpeSearch(const SweepConfig& config) : config_(config) {}
  std::optional<Assignment> suggest(int trial, const std::vector<Observation>& history) override;

 private:
  SweepConfig config_;
};

}  // namespace shoal::run::sweep
