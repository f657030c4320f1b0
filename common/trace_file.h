// One rank's trace file: what a TraceSink kept, as Chrome trace / Perfetto JSON, with times
// already on rank 0's clock. run/trace_merge.h joins the files of a job into one.
//
// Format (the Chrome "JSON Object Format"):
//   {"traceEvents": [...], "displayTimeUnit": "ns",
//    "otherData": {"shoal_trace": 1, "rank": R, "host": "...", "clock_offset_ns": O,
//                  "clock_error_ns": E, "clock_measured": true, "recorded": N, "dropped": D,
//                  "capacity": C,
//                  "clock_sync": [{"at_ns": A, "offset_ns": O1, "error_ns": E1}, ...]}}
// - A span of a thread is an "X" event: pid = rank, tid = thread, ts and dur in microseconds
//   (fractions keep the nanoseconds), its arguments in "args".
// - An asynchronous span (TraceSpan::asyncId) is a "b" / "e" pair with that id and "cat", which
//   viewers draw on a track of its own.
// - ts = (the sink's time + O) / 1000: O is this rank's clock offset against rank 0
//   (comm/clock_sync.h) measured at start-up, known to within E nanoseconds either way then.
// - "clock_sync" (optional; absent in files written before it, which mean the one measurement
//   O, E) lists every measurement of the offset in the order taken, the first being O, E: A is
//   when, on this rank's clock (the sink's). Clocks drift apart, so the merge (run/trace_merge.h)
//   maps each time with the offset interpolated between the measurements around it
//   (common/clock_map.h) instead of O alone: sink time = ts * 1000 - O. Empty when the clock
//   was not measured.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock_map.h"
#include "common/trace.h"

namespace shoal {

// The trace format's version, "shoal_trace" in otherData: the merger refuses others.
inline constexpr int kTraceFormatVersion = 1;

struct RankTraceInfo {
  int rank = 0;
  std::string host;
  int64_t clockOffsetNs = 0;  // added to this rank's times to read rank 0's clock
  int64_t clockErrorNs = 0;   // the offset's error bound (half the best round trip)
  // False where no offset was measured (0 is then exact only on rank 0's host).
  bool clockMeasured = true;
  // Every measurement, oldest first ("clock_sync"); the first is the one above. Empty: the file
  // has no "clock_sync" (the merge then uses the offset above alone).
  std::vector<ClockSample> clockSamples;
};

// The file's text for `spans` (oldest first) of a sink that dropped `dropped` and recorded
// `recorded` spans with room for `capacity`. Pure; never throws but std::bad_alloc.
std::string rankTraceJson(const std::vector<TraceSpan>& spans, const RankTraceInfo& info,
                          uint64_t recorded, uint64_t dropped, size_t capacity);

// Writes what `sink` holds now to `path` atomically (a temporary file in the same folder,
// renamed over `path`; readers never see half a file). Blocking; the sink keeps recording.
// SystemError naming the file if it cannot be written.
void writeRankTrace(const TraceSink& sink, const RankTraceInfo& info, const std::string& path);

// Writes `text` to `path` through a temporary beside it (<path>.tmp.<pid>.<tid>) renamed over it,
// so that a reader sees the old file or the whole new one. SystemError naming the file.
void writeFileAtomically(const std::string& path, std::string_view text);

// This machine's host name (for RankTraceInfo::host).
std::string localHostName();

}  // namespace shoal
