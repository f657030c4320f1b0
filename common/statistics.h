// Small summaries of measured times, shared by what decides from them (comm/autotuner.h,
// comm/straggler_monitor.h).
#pragma once

#include <algorithm>
#include <vector>

namespace shoal {

// The median of `values` (the mean of the two middle ones for an even count). Needs at least one
// value: the callers take it of windows that are never empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace shoal
