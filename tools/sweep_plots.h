// `shoal sweep`'s plots (PNG, tools/plot.h), into DIR/plots/:
//   metric_by_trial.png     each trial's metric by trial number (completed and stopped early
//                           apart) and the best so far
//   metric_vs_<param>.png   the metric against each parameter (a log10 axis for log-scaled ones,
//                           a choice's index for choices, its values named in the axis label)
// Stateless; blocks on the file system; SystemError naming the file when one cannot be written.
#pragma once

#include <string>

#include "run/sweep/sweep_runner.h"

namespace shoal::tools {

// Writes the plots; returns how many.
int writeSweepPlots(const std::string& dir, const run::sweep::SweepConfig& config,
                    const run::sweep::SweepResult& result);

}  // namespace shoal::tools
