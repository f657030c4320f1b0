// `shoal sweep`: the command-line side of run/sweep/sweep_runner.h. Reads the configuration
// (CONFIG.json, or DIR/sweep.json with --resume), applies the command line's overrides, runs
// the sweep with SIGINT/SIGTERM as its stop request, then prints the results table and writes
// DIR/results.csv, DIR/best.json and the plots (tools/sweep_plots.h).
//
// Exit status: 0 when at least one trial completed; 1 when none did (or the sweep failed);
// 2 for a usage or configuration error (one line on stderr); 130 when stopped by a signal (the
// finished trials are kept: `shoal sweep --resume DIR` goes on). Call from the main thread:
// it blocks SIGINT and SIGTERM in it while the sweep runs.
#pragma once

#include <optional>
#include <string>

namespace shoal::tools {

struct SweepCommandOptions {
  std::string configPath;  // empty: the configuration DIR/sweep.json holds (resume); with
                           // resume and no dir, a directory here is the dir

  std::string dir;
  bool resume = false;  // DIR must hold a sweep already
  bool force = false;   // run CONFIG in a DIR holding another sweep
  // Overrides of the configuration's values, as typed (checked like every number flag).
  // trialTimeLimit (seconds, 0: none) is kept in DIR/sweep.json: a resume without the flag
  // bounds its trials the same way.
  std::string parallel, trials, algorithm, seed, trialTimeLimit;
  // Where the trials run, as `shoal run` takes them (run/hosts.h); neither: this machine. Not
  // kept in DIR: a resume names its hosts again (or runs locally).
  std::string hosts, hostfile, ssh;
};

int runSweepCommand(const SweepCommandOptions& options);

}  // namespace shoal::tools
