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

// The lower middle of `values` (0 for none): what a straggler is compared with. With an even
// count the two middle values are not averaged, so with two ranks the slower is compared with
// the faster (a mean would make a 3x-slow rank look 1.5x).
inline double lowerMedian(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

}  // namespace shoal
