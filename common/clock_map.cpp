#include "common/clock_map.h"

#include <algorithm>

#include "common/error.h"

namespace shoal {

ClockMap::ClockMap(std::vector<ClockSample> samples) : samples_(std::move(samples)) {
  for (size_t i = 0; i < samples_.size(); ++i) {
    if (samples_[i].errorNs < 0) {
      SHOAL_THROW(InvalidArgument, "clock measurement {}: negative error bound {} ns", i,
                  samples_[i].errorNs);
    }
    if (i > 0 && samples_[i].atNs < samples_[i - 1].atNs) {
      SHOAL_THROW(InvalidArgument, "clock measurement {} was taken before measurement {}", i,
                  i - 1);
    }
  }
}

double ClockMap::offsetAt(double localNs, int64_t* errorNs) const {
  if (samples_.empty()) {
    if (errorNs != nullptr) *errorNs = 0;
    return 0;
  }
  // The first measurement taken after localNs; the one before it is the other end.
  const auto after = std::upper_bound(
      samples_.begin(), samples_.end(), localNs,
      [](double t, const ClockSample& s) { return t < static_cast<double>(s.atNs); });
  if (after == samples_.begin() || after == samples_.end()) {
    const ClockSample& held = after == samples_.begin() ? samples_.front() : samples_.back();
    if (errorNs != nullptr) *errorNs = held.errorNs;
    return static_cast<double>(held.offsetNs);
  }
  const ClockSample& a = *(after - 1);
  const ClockSample& b = *after;
  if (errorNs != nullptr) *errorNs = std::max(a.errorNs, b.errorNs);
  // In doubles: a crafted file's values must not overflow a difference. a.atNs < b.atNs here
  // (b is after localNs, a at or before it).
  const double span = static_cast<double>(b.atNs) - static_cast<double>(a.atNs);
  const double f = (localNs - static_cast<double>(a.atNs)) / span;
  return static_cast<double>(a.offsetNs) +
         f * (static_cast<double>(b.offsetNs) - static_cast<double>(a.offsetNs));
}

}  // namespace shoal
