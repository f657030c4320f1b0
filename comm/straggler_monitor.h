// Straggler detection at run time (README "Stragglers"): which ranks are persistently slower
// than the others, and in which phase of the step.
//
// Each rank notes, every step, how long each phase took (compute, data loading, ... as the
// caller names them; communication is not one: waiting for a straggler makes everyone's
// communication slow). Every `window` steps the ranks exchange their per-phase means over the
// window (one all-gather of `phases` doubles per rank) and each computes the same verdict: a
// rank is slow in a phase when its mean is above `threshold` times the median of all ranks'
// means for that phase (the lower middle for an even count: common/statistics.h), and a straggler
// when it was slow in that phase in `persist` windows in a row (one slow window is noise: a page
// fault storm, a checkpoint). When the set of stragglers changes, rank 0 logs one warning naming
// them, the phase and the numbers.
//
// Contract: collective every `window` calls of step(): every rank of the group calls step()
// the same number of times (like any collective, in the same order relative to the group's
// other collectives). Errors are the group's (comm/group.h): a rank that stops calling is a
// TimeoutError on the others at the exchange. Not thread-safe (the training loop's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::comm {

struct StragglerOptions {
  std::vector<std::string> phases = {"compute"};
  int window = 20;         // steps per exchange, at least 1
  double threshold = 1.3;  // slow: above threshold x the median of the ranks; > 1
  int persist = 2;         // windows in a row before a slow rank is named, at least 1
  // Phases shorter than this on the median rank are never judged: ratios of microseconds are
  // noise, not stragglers.
  double minSeconds = 1e-4;
};

struct Straggler {
  int rank = 0;
  std::string phase;
  double seconds = 0;        // its mean per step over the last window
  double medianSeconds = 0;  // the median rank's
  double ratio() const { return medianSeconds > 0 ? seconds / medianSeconds : 0; }
};

// What one exchange found; the same on every rank.
struct StragglerReport {
  int64_t step = 0;  // steps noted so far (the window ends here)
  // means[phase][rank]: each rank's mean seconds per step over the window.
  std::vector<std::vector<double>> means;
  std::vector<double> medians;        // per phase
  std::vector<Straggler> stragglers;  // slow for `persist` windows in a row, by rank then phase
  // "no straggler", or "rank 2: compute 41.0 ms per step, 1.9x the median 21.3 ms; ..."
  std::string describe() const;
};

class StragglerMonitor {
 public:
  // InvalidArgument for options out of range or no phases.
  StragglerMonitor(std::shared_ptr<Group> group, StragglerOptions options);

  // Notes one step: seconds per phase, in the order of options.phases (InvalidArgument for
  // another count, a negative or non-finite value). At the end of a window, exchanges with the
  // other ranks (blocking, under the group's deadline) and returns the report; else nullopt.
  std::optional<StragglerReport> step(std::span<const double> phaseSeconds);
  std::optional<StragglerReport> step(double seconds) { return step(std::span(&seconds, 1)); }

  // The current stragglers (after the last exchange).
  const std::vector<Straggler>& stragglers() const { return current_; }

 private:
  std::shared_ptr<Group> group_;
  StragglerOptions options_;
  std::vector<double> sums_;  // per phase, this window
  int inWindow_ = 0;
  int64_t steps_ = 0;
  // slowWindows_[phase][rank]: consecutive windows the rank was slow in the phase.
  std::vector<std::vector<int>> slowWindows_;
  std::vector<Straggler> current_;
};

}  // namespace shoal::comm
