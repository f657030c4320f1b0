// Autotuning by successive halving (README "Autotuning"): during a job's first steps, try each
// candidate configuration (bucket sizes, all-reduce algorithms, compression settings: whatever
// the caller's labels stand for), keep the faster half, give the survivors twice the steps, and
// so on until one is left; then every rank runs the same winner.
//
// How it is used: before each step, current() says which candidate to run (the caller applies
// it); after the step, record(seconds) notes how long it took. A candidate's trial is
// `warmupSteps` steps (not counted: a new configuration's first step pays for its set-up) and
// then the round's steps; its time is the median of those, and the ranks agree on it by taking
// the largest over ranks (one all-reduce of one number per trial): a step is as slow as its
// slowest rank, and every rank then ranks the candidates identically, so all pick the same.
// The budget: with C candidates and S steps in the first round, about S x C x log2(C) steps.
//
// Contract: record() is collective at the end of each trial (every rank calls it the same number
// of times, in the same order relative to the group's other collectives). Errors are the
// group's (comm/group.h). Not thread-safe (the training loop's thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::comm {

struct AutotuneOptions {
  int warmupSteps = 1;    // steps per trial not timed, at least 0
  int stepsPerRound = 3;  // timed steps per trial in the first round (doubled each round), >= 1
};

struct AutotuneTrial {
  size_t candidate = 0;
  int round = 0;
  int steps = 0;       // timed steps
  double seconds = 0;  // median step time, the largest over ranks
};

class Autotuner {
 public:
  // InvalidArgument for no candidates or options out of range. With one candidate it is done at
  // once.
  Autotuner(std::shared_ptr<Group> group, std::vector<std::string> labels,
            AutotuneOptions options = {});

  bool done() const { return alive_.size() == 1; }
  // The candidate to run now (the winner once done()).
  size_t current() const { return done() ? alive_[0] : alive_[next_]; }
  size_t best() const;  // the winner; InvalidArgument before done()
  const std::string& label(size_t candidate) const { return labels_.at(candidate); }

  // Notes the step just run with current() (a non-negative finite time, else InvalidArgument).
  // Collective at the end of a trial; returns true when this step finished the search.
  // After done(), does nothing and returns false.
  bool record(double seconds);

  // Every trial so far, in order.
  const std::vector<AutotuneTrial>& trials() const { return trials_; }
  // "bucket=4MiB: 21.3 ms per step (round 3, 12 steps); then bucket=25MiB 22.0 ms, ..." :
  // the winner and every candidate's last trial, fastest first.
  std::string describe() const;

 private:
  void endTrial();

  std::shared_ptr<Group> group_;
  std::vector<std::string> labels_;
  AutotuneOptions options_;
  std::vector<size_t> alive_;  // candidates in this round
  size_t next_ = 0;            // index into alive_ of the one on trial
  int round_ = 0;
  int stepInTrial_ = 0;
  std::vector<double> times_;         // this trial's timed steps
  std::vector<double> roundSeconds_;  // per alive_ entry, this round
  std::vector<AutotuneTrial> trials_;
};

}  // namespace shoal::comm
