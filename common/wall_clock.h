// The wall clock in nanoseconds since the epoch: the one time base of what Shoal writes for
// people and other processes to read (flight recorders, run records, metrics), which must be
// comparable across processes and hosts, unlike the steady clock.
#pragma once

#include <time.h>

#include <cstdint>

namespace shoal {

// CLOCK_REALTIME through the vDSO (no system call): cheap enough for every operation.
inline int64_t wallClockNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace shoal
