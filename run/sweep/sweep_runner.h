// `shoal sweep`'s driver: runs a configuration's trials, `parallel` at a time, each as a child
// job (`shoal run -n RANKS -- program ...`, or the program itself with "launcher": "direct") in
// its own folder DIR/trial-NNNN (log.txt: its output; metrics.jsonl: the metrics it appends;
// flight/: the launcher's flight recorders),
// feeding finished trials to the search algorithm and per-epoch metrics to ASHA.
//
// Waiting: one poll(2) over the trials' pidfds and `stopFd`, with a timeout that is the nearest
// of: the next re-read of the metrics files (pollSeconds), a trial's time limit, a SIGKILL
// escalation, the sweep's time limit. No sleeps, no busy loop; every wait has a deadline.
//
// Failures: a trial that exits non-zero or without its metric is recorded as failed and the sweep
// goes on; a trial that cannot be started at all (program missing) is recorded as failed too.
// The sweep throws only for its own problems: InvalidArgument (a directory holding another
// sweep, or in use by a running one: DIR/sweep.lock), SystemError (the journal cannot be
// written).
//
// Hosts (`hosts` not empty): the trials' ranks go to the hosts' slots (trial_slots.h). A trial
// starts only when ranks_per_trial slots are free, so at most min(parallel, slots / ranks) run
// at once, and its `shoal run` gets `--hosts` naming exactly its slots, `--ssh`, and `-x` for
// the configuration's env and SHOAL_SWEEP_SLOTS (its slots in rank order); the journal records
// both. InvalidArgument before anything starts when ranks_per_trial exceeds the slots or the
// configuration starts trials directly ("launcher": "direct"). No hosts: every trial on this
// machine, `parallel` at a time, as before.
//
// Resume: DIR/sweep.json and the journal (sweep_journal.h) are read first: finished trials are
// kept (and replayed into ASHA and the algorithm's history), interrupted ones run again with the
// same parameters, new ones continue the numbering.
//
// Threading: call from the main thread (trials are killed when the thread that started them
// ends; spawner.h). Blocking until every trial has finished, the budget or time is spent, or
// stopFd becomes readable.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "run/hosts.h"
#include "run/sweep/search_space.h"
#include "run/sweep/sweep_journal.h"

namespace shoal::run::sweep {

struct SweepOptions {
  std::string dir;  // created if missing
  SweepConfig config;
  SweepRecord record;  // what DIR/sweep.json holds (the configuration as given, algorithm, seed)
  // With a DIR holding another sweep: take this one instead (finished trials whose parameters
  // fit the new space are kept). Without it such a DIR is an InvalidArgument.
  bool force = false;
  std::string shoalProgram;       // the `shoal` binary (for "launcher": "shoal")
  std::vector<HostSlots> hosts;   // empty: trials on this machine
  std::string sshCommand;         // with hosts: `shoal run --ssh` (empty: its default)
  std::vector<std::string> env;   // the trials' base environment ("NAME=value"); config.env added
  double pollSeconds = 0.25;      // how often running trials' metrics files are re-read
  int stopFd = -1;                // readable: stop now (trials killed, left to a resume)
  std::FILE* progress = nullptr;  // one line per trial event; nullptr: quiet
};

struct SweepResult {
  std::vector<TrialRecord> trials;  // every finished trial (this run's and earlier), by id
  std::optional<size_t> best;       // index into trials: the best completed one
  bool interrupted = false;         // stopFd fired: unfinished trials are left for a resume
  bool timedOut = false;            // the sweep's time limit stopped it
  int resumedTrials = 0;            // finished trials found in the journal
  int skippedJournalLines = 0;
  double seconds = 0;  // this run's wall time
};

SweepResult runSweep(const SweepOptions& options);

// The trial's folder: DIR/trial-0007.
std::string trialDirectory(const std::string& dir, int trial);

}  // namespace shoal::run::sweep
