// One rank's clock mapped onto rank 0's from the offsets measured over a job (comm/clock_sync.h,
// run/trace_session.h): what puts a long job's spans on one time axis although the clocks drift
// apart.
//
// Between two measurements the offset is interpolated linearly (clocks drift at a rate that
// changes slowly: NTP's model); before the first and after the last it is held (clamped). A
// time mapped between measurements a and b is as good as the worse of their two error bounds
// while the drift is linear between them; one mapped outside is as good as the nearest
// measurement's bound plus the drift since, which no one measured: measure at the end of a job
// (the trace session does).
//
// Pure; thread-safe once built.
#pragma once

#include <cstdint>
#include <vector>

namespace shoal {

struct ClockSample {
  int64_t atNs = 0;      // when it was measured, on this rank's clock
  int64_t offsetNs = 0;  // add to this rank's clock to read rank 0's
  int64_t errorNs = 0;   // the true offset is within offsetNs ± errorNs
};

class ClockMap {
 public:
  // `samples` in the order they were measured: InvalidArgument (one line) if their times go
  // backwards or an error bound is negative. Empty: the identity with no error (an unmeasured
  // clock).
  explicit ClockMap(std::vector<ClockSample> samples);

  // The offset to add to `localNs` (this rank's clock) to read rank 0's there, and through
  // `errorNs` (if given) the largest error bound of the measurements it was taken from.
  double offsetAt(double localNs, int64_t* errorNs = nullptr) const;

  const std::vector<ClockSample>& samples() const { return samples_; }

 private:
  std::vector<ClockSample> samples_;
};

}  // namespace shoal
