#include "comm/straggler_monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/log.h"
#include "common/statistics.h"

namespace shoal::comm {

namespace {

std::string ms(double seconds) {
  return fmt::format("{:.1f} ms", seconds * 1e3);
}

bool sameRanksAndPhases(const std::vector<Straggler>& a, const std::vector<Straggler>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](auto& x, auto& y) { return x.rank == y.rank && x.phase == y.phase; });
}

}  // namespace

std::string StragglerReport::describe() const {
  if (stragglers.empty()) return "no straggler";
  std::string out;
  for (const auto& s : stragglers) {
    if (!out.empty()) out += "; ";
    out += fmt::format("rank {}: {} {} per step, {:.1f}x the median {}", s.rank, s.phase,
                       ms(s.seconds), s.ratio(), ms(s.medianSeconds));
  }
  return out;
}

StragglerMonitor::StragglerMonitor(std::shared_ptr<Group> group, StragglerOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  SHOAL_CHECK(group_ != nullptr, "StragglerMonitor needs a group");
  if (options_.phases.empty() || options_.window < 1 || options_.persist < 1 ||
      !(options_.threshold > 1) || !std::isfinite(options_.threshold) ||
      !(options_.minSeconds >= 0)) {
    SHOAL_THROW(InvalidArgument,
                "StragglerMonitor: needs at least one phase, window >= 1, persist >= 1, a finite "
                "threshold > 1 and minSeconds >= 0 (got {} phases, window {}, persist {}, "
                "threshold {}, minSeconds {})",
                options_.phases.size(), options_.window, options_.persist, options_.threshold,
                options_.minSeconds);
  }
  sums_.assign(options_.phases.size(), 0);
  slowWindows_.assign(options_.phases.size(), std::vector<int>(group_->size(), 0));
}

std::optional<StragglerReport> StragglerMonitor::step(std::span<const double> phaseSeconds) {
  if (phaseSeconds.size() != options_.phases.size()) {
    SHOAL_THROW(InvalidArgument, "StragglerMonitor: {} phase times for {} phases",
                phaseSeconds.size(), options_.phases.size());
  }
  for (size_t p = 0; p < phaseSeconds.size(); ++p) {
    if (!std::isfinite(phaseSeconds[p]) || phaseSeconds[p] < 0) {
      SHOAL_THROW(InvalidArgument, "StragglerMonitor: phase {} took {} s", options_.phases[p],
                  phaseSeconds[p]);
    }
    sums_[p] += phaseSeconds[p];
  }
  ++steps_;
  if (++inWindow_ < options_.window) return std::nullopt;

  const size_t phases = sums_.size();
  const int ranks = group_->size();
  std::vector<double> mine(phases);
  for (size_t p = 0; p < phases; ++p) mine[p] = sums_[p] / inWindow_;
  std::vector<double> all(phases * static_cast<size_t>(ranks));
  allgather(*group_, mine.data(), all.data(), phases, DataType::kFloat64);
  std::fill(sums_.begin(), sums_.end(), 0);
  inWindow_ = 0;

  StragglerReport report;
  report.step = steps_;
  report.means.assign(phases, std::vector<double>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (size_t p = 0; p < phases; ++p) report.means[p][r] = all[r * phases + p];
  }
  std::vector<Straggler> found;
  for (size_t p = 0; p < phases; ++p) {
    const double m = lowerMedian(report.means[p]);
    report.medians.push_back(m);
    for (int r = 0; r < ranks; ++r) {
      const bool slow = m >= options_.minSeconds && report.means[p][r] > options_.threshold * m;
      int& windows = slowWindows_[p][r];
      windows = slow ? windows + 1 : 0;
      if (windows >= options_.persist) {
        found.push_back({r, options_.phases[p], report.means[p][r], m});
      }
    }
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.phase < b.phase;
  });
  report.stragglers = found;
  // One line when the set changes, from one rank: the same verdict is on every rank.
  if (group_->rank() == 0 && !sameRanksAndPhases(found, current_)) {
    if (found.empty()) {
      SHOAL_LOG_WARN("stragglers: none any more (step {})", steps_);
    } else {
      SHOAL_LOG_WARN(
          "stragglers at step {} (slower than {:.2f}x the median for {} windows of {} "
          "steps): {}",
          steps_, options_.threshold, options_.persist, options_.window, report.describe());
    }
  }
  current_ = std::move(found);
  return report;
}

}  // namespace shoal::comm
