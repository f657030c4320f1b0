#include "tools/run_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "common/statistics.h"

namespace shoal::tools {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Points = std::vector<std::pair<double, double>>;

std::map<int, Points> byRank(track::MetricsStore& store, const std::string& name) {
  std::map<int, Points> out;
  for (const track::MetricRow& row : store.series(name)) {
    out[row.rank].emplace_back(static_cast<double>(row.step), row.value);
  }
  return out;
}

Points meanOverRanks(const std::map<int, Points>& ranks) {
  std::map<double, std::pair<double, int>> acc;
  for (const auto& [rank, points] : ranks) {
    for (const auto& [step, value] : points) {
      if (!std::isfinite(value)) continue;
      auto& a = acc[step];
      a.first += value;
      a.second += 1;
    }
  }
  Points out;
  out.reserve(acc.size());
  for (const auto& [step, a] : acc) out.emplace_back(step, a.first / a.second);
  return out;
}

// Note [Stragglers]: the lower middle of the ranks' compute times, as comm/straggler_monitor.h
// judges them.
double medianCompute(const std::vector<RankBreakdown>& rows) {
  std::vector<double> c;
  for (const RankBreakdown& r : rows) c.push_back(r.computeS);
  return lowerMedian(std::move(c));
}

// The finite values of `rank` in `series`, by step.
std::map<double, double> valuesAt(const std::map<int, Points>& series, int rank) {
  std::map<double, double> at;
  if (auto it = series.find(rank); it != series.end()) {
    for (const auto& [step, v] : it->second) {
      if (std::isfinite(v)) at[step] = v;
    }
  }
  return at;
}

// The named step-time series (step_time_s and its parts) by rank.
struct StepSeries {
  std::map<int, Points> steps, communication, waiting, commWait;
};

std::vector<RankBreakdown> breakdown(const StepSeries& s) {
  std::vector<RankBreakdown> rows;
  for (const auto& [rank, points] : s.steps) {
    const auto commAt = valuesAt(s.communication, rank);
    const auto waitAt = valuesAt(s.waiting, rank);
    const auto oldCommAt = valuesAt(s.commWait, rank);
    const auto find = [](const std::map<double, double>& at, double step) {
      const auto it = at.find(step);
      return it == at.end() ? std::optional<double>() : it->second;
    };
    RankBreakdown b{.rank = rank};
    for (const auto& [step, v] : points) {
      if (!std::isfinite(v) || v < 0) continue;
      const auto comm = find(commAt, step);
      const auto wait = find(waitAt, step);
      // A run from before the three parts: comm_wait_s is all it says.
      const double c = comm || wait ? comm.value_or(0) : find(oldCommAt, step).value_or(0);
      const double communication = std::clamp(c, 0.0, v);
      b.stepS += v;
      b.commS += communication;
      b.waitS += std::clamp(wait.value_or(0), 0.0, v - communication);
      ++b.steps;
    }
    if (b.steps > 0) {
      b.stepS /= b.steps;
      b.commS /= b.steps;
      b.waitS /= b.steps;
      b.computeS = std::max(0.0, b.stepS - b.commS - b.waitS);
    }
    rows.push_back(b);
  }
  const double median = medianCompute(rows);
  for (RankBreakdown& b : rows) b.computeRatio = median > 0 ? b.computeS / median : 0;
  return rows;
}

}  // namespace

RankStats rankStats(int rank, const Points& points) {
  RankStats s{
      .rank = rank, .count = points.size(), .last = kNaN, .min = kNaN, .max = kNaN, .mean = kNaN};
  if (!points.empty()) s.last = points.back().second;
  double sum = 0;
  size_t finite = 0;
  for (const auto& [step, v] : points) {
    if (!std::isfinite(v)) continue;
    s.min = finite == 0 ? v : std::min(s.min, v);
    s.max = finite == 0 ? v : std::max(s.max, v);
    sum += v;
    ++finite;
  }
  if (finite > 0) s.mean = sum / static_cast<double>(finite);
  return s;
}

RunSummary summarizeRun(track::MetricsStore& store) {
  RunSummary out;
  StepSeries steps;
  std::map<int, Points> ratios, verdicts;
  for (const std::string& name : store.metricNames()) {
    std::map<int, Points> ranks = byRank(store, name);
    MetricSummary m{.name = name};
    if (ranks.size() > 1) m.mean = meanOverRanks(ranks);
    for (const auto& [rank, points] : ranks) m.stats.push_back(rankStats(rank, points));
    if (name == "step_time_s") steps.steps = ranks;
    if (name == "communication_s") steps.communication = ranks;
    if (name == "waiting_s") steps.waiting = ranks;
    if (name == "comm_wait_s") steps.commWait = ranks;
    if (name == "compute_ratio") ratios = ranks;
    if (name == "straggler") verdicts = ranks;
    m.byRank.assign(std::make_move_iterator(ranks.begin()), std::make_move_iterator(ranks.end()));
    out.metrics.push_back(std::move(m));
  }
  out.breakdown = breakdown(steps);
  out.stragglerRule = !verdicts.empty() ? StragglerRule::kJobVerdict
                      : !ratios.empty() ? StragglerRule::kComputeRatio
                                        : StragglerRule::kBreakdown;
  switch (out.stragglerRule) {
    case StragglerRule::kJobVerdict:
      for (const auto& [rank, points] : verdicts) {
        if (!points.empty() && points.back().second == 1) out.stragglers.push_back(rank);
      }
      break;
    case StragglerRule::kComputeRatio:
      for (const auto& [rank, points] : ratios) {
        const size_t n = points.size();
        bool slow = n >= static_cast<size_t>(kStragglerWindows);
        for (size_t i = n - std::min(n, static_cast<size_t>(kStragglerWindows)); i < n; ++i) {
          slow = slow && points[i].second > kStragglerRatio;  // NaN is never above
        }
        if (slow) out.stragglers.push_back(rank);
      }
      break;
    case StragglerRule::kBreakdown:
      for (const RankBreakdown& b : out.breakdown) {
        if (b.computeRatio > kStragglerRatio) out.stragglers.push_back(b.rank);
      }
      break;
  }
  for (RankBreakdown& b : out.breakdown) {
    if (auto it = ratios.find(b.rank); it != ratios.end() && !it->second.empty()) {
      b.lastComputeRatio = it->second.back().second;
    }
    b.straggler = std::binary_search(out.stragglers.begin(), out.stragglers.end(), b.rank);
  }
  out.dropped = store.dropped();
  return out;
}

}  // namespace shoal::tools
