// A sweep's results as people and programs read them: the printed table, DIR/results.csv and
// DIR/best.json. Plots are tools/sweep_plots.h's (the PNG writer lives above this layer).
// Stateless; the writers block on the file system and throw SystemError naming the file.
#pragma once

#include <string>

#include "run/sweep/search_space.h"
#include "run/sweep/sweep_runner.h"

namespace shoal::run::sweep {

// One row per trial: id, each parameter, the metric, status, epochs, seconds; then the best
// trial and its full command line (or why there is none).
std::string formatResultsTable(const SweepConfig& config, const SweepResult& result,
                               const std::string& dir);

// id,<parameters...>,<metric>,status,epochs,seconds,reason (RFC 4180 quoting).
void writeResultsCsv(const std::string& path, const SweepConfig& config, const SweepResult& result);

// {"trial", "metric", "metric_name", "params": {...}, "command": [...], "env": {...},
// "seconds"}, or {"trial": null} with no completed trial.
void writeBestJson(const std::string& path, const SweepConfig& config, const SweepResult& result,
                   const std::string& dir);

// The best trial's command line as the sweep ran it: the configuration's variables first
// (NAME=value), the launcher, the program; words quoted for sh where they need it.
std::string bestCommandLine(const SweepConfig& config, const TrialRecord& best,
                            const std::string& dir);

}  // namespace shoal::run::sweep
