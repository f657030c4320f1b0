#include "run/sweep/grid_search.h"

#include <cmath>

#include "common/error.h"

namespace shoal::run::sweep {

std::vector<double> gridValues(const Parameter& p) {
  std::vector<double> values;
  if (p.kind == ParamKind::kChoice) {
    for (size_t i = 0; i < p.choices.size(); ++i) values.push_back(static_cast<double>(i));
    return values;
  }
  if (p.kind == ParamKind::kInt && p.high - p.low + 1 <= p.gridPoints) {
    for (double v = p.low; v <= p.high; v += 1) values.push_back(v);
    return values;
  }
  const double a = toInternal(p, p.low), b = toInternal(p, p.high);
  for (int i = 0; i < p.gridPoints; ++i) {
    double v =
        i + 1 == p.gridPoints ? p.high : fromInternal(p, a + (b - a) * i / (p.gridPoints - 1));
    if (i == 0) v = p.low;
    if (p.kind == ParamKind::kInt) v = std::round(v);
    if (values.empty() || values.back() != v) values.push_back(v);  // ints may coincide
  }
  return values;
}

GridSearch::GridSearch(const SweepConfig& config) {
  constexpr size_t kMaxGrid = 10'000'000;
  for (const Parameter& p : config.parameters) {
    axes_.push_back(gridValues(p));
    size_ *= axes_.back().size();
    if (size_ > kMaxGrid) {
      SHOAL_THROW(InvalidArgument, "grid search: more than {} points (at parameter {})", kMaxGrid,
                  p.name);
    }
  }
}

std::optional<Assignment> GridSearch::suggest(int trial, const std::vector<Observation>&) {
  if (trial < 0 || static_cast<size_t>(trial) >= size_) return std::nullopt;
  Assignment a(axes_.size());
  size_t k = static_cast<size_t>(trial);
  for (size_t i = axes_.size(); i-- > 0;) {
    a[i] = axes_[i][k % axes_[i].size()];
    k /= axes_[i].size();
  }
  return a;
}

}  // namespace shoal::run::sweep
