// Early stopping by asynchronous successive halving (ASHA, Li et al., 2020), fed with the
// per-epoch metric each trial reports.
//
// Rungs sit at epochs min_epochs * reduction_factor^k (k = 0, 1, ...), below max_epochs when
// that is set (a trial's last epoch is never a decision). When a trial reports its metric at a
// rung's epoch, the value joins that rung's record and the trial goes on only if it ranks in the
// top 1/reduction_factor of every value the rung has recorded so far (its own included):
// with n values, at least as good as the floor(n / reduction_factor)-th best, or the best
// while n < reduction_factor (the rule of Optuna's SuccessiveHalvingPruner, so the first
// trials at a rung always go on). Decisions never wait for other trials: hence asynchronous.
//
// Not thread-safe; the sweep drives it from one thread.
#pragma once

#include <vector>

#include "run/sweep/search_space.h"

namespace shoal::run::sweep {

class Asha {
 public:
  Asha(const EarlyStopping& options, Direction direction);

  // The trial's metric at `epoch` (1-based). True: stop the trial now. An epoch that is not a
  // rung is not recorded and never stops a trial; a NaN value at a rung stops it.
  bool report(int epoch, double value);

  bool isRung(int epoch) const;
  // The values recorded at the rung at `epoch` (tests, reports).
  const std::vector<double>& recorded(int epoch) const;

 private:
  EarlyStopping options_;
  Direction direction_;
  std::vector<std::vector<double>> rungs_;  // by rung index
};

}  // namespace shoal::run::sweep
