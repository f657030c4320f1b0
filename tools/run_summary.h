// What `shoal report` (tools/report.h) says about a run's metrics, computed from its store
// (track/metrics_store.h): each metric per rank with its statistics and the mean over ranks, each
// rank's step time split into compute, communication and waiting, and the stragglers.
//
// The split (Note [Step-time breakdown] in train/trainer.h): communication_s and waiting_s as
// the rank logged them at each step, compute the rest of step_time_s. A step that logged
// neither (a run from before them) takes comm_wait_s as its communication and no waiting.
//
// Note [Stragglers]: a straggler is a rank whose compute is persistently above the others'.
// When the run logged `straggler` (the job's own monitor's verdict at each window's end, at the
// job's threshold and persistence: train/trainer/tracking_callback.h), a rank is a straggler when
// its newest value is 1: the job's rule, not one of the report's. Else, when the run logged
// `compute_ratio` (a rank's mean compute time over a window, divided by the median rank's), a
// rank is a straggler when its last kStragglerWindows values all exceed kStragglerRatio. Else
// the step-time breakdown decides: a rank whose mean compute (its step time less communication
// and waiting) exceeds kStragglerRatio times the median rank's. The median rank of an even count
// is the lower middle one, so of two ranks the slower is compared with the faster. The dashboard
// (tools/ui_page.h) marks its breakdown by the same rules.
//
// Reads only; blocking on the store's file. Not thread-safe (the store is not).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "track/metrics_store.h"

namespace shoal::tools {

inline constexpr double kStragglerRatio = 1.3;
inline constexpr int kStragglerWindows = 2;

// The rules of Note [Stragglers], the first that applies.
enum class StragglerRule { kJobVerdict, kComputeRatio, kBreakdown };

// One rank's values of one metric. min, max and mean are over the finite values (NaN when there
// is none); last is the newest value logged, NaN included.
struct RankStats {
  int rank = 0;
  size_t count = 0;  // points, NaN included
  double last = 0, min = 0, max = 0, mean = 0;
};

struct MetricSummary {
  std::string name;
  // (step, value) of each rank in log order, by rank.
  std::vector<std::pair<int, std::vector<std::pair<double, double>>>> byRank;
  // The mean over ranks at each step any rank logged a finite value, by step; empty with one
  // rank.
  std::vector<std::pair<double, double>> mean;
  std::vector<RankStats> stats;  // by rank
};

// One rank's step time over the whole run (means over its steps with a finite step_time_s).
struct RankBreakdown {
  int rank = 0;
  size_t steps = 0;
  double stepS = 0;
  // At each step, at most the step time together: communication_s (or comm_wait_s, see above)
  // and waiting_s, 0 where none.
  double commS = 0;
  double waitS = 0;
  double computeS = 0;                     // stepS - commS - waitS
  double computeRatio = 0;                 // computeS over the median rank's
  std::optional<double> lastComputeRatio;  // the newest logged compute_ratio, if any
  bool straggler = false;                  // Note [Stragglers]
};

struct RunSummary {
  std::vector<MetricSummary> metrics;                       // in the store's name order
  std::vector<RankBreakdown> breakdown;                     // by rank; empty without step_time_s
  std::vector<int> stragglers;                              // ascending
  StragglerRule stragglerRule = StragglerRule::kBreakdown;  // which one applied
  std::vector<track::DroppedPoints> dropped;
};

// Reads every metric of `store`. Throws what the store's reads throw.
RunSummary summarizeRun(track::MetricsStore& store);

// The statistics of one rank's values (exposed for tests).
RankStats rankStats(int rank, const std::vector<std::pair<double, double>>& points);

}  // namespace shoal::tools
