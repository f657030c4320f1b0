// One timeline for a whole job: the per-rank trace files (common/trace_file.h) merged into one
// Chrome trace / Perfetto JSON file (chrome://tracing, ui.perfetto.dev), as `shoal run --trace`
// writes it.
//
// The output: every rank's events on rank 0's clock, a "process_name" ("rank R (host)") and
// "process_sort_index" metadata event per rank, and
//   "otherData": {"shoal_trace": 1, "ranks": N, "rank_list": [...], "missing_ranks": [...],
//                 "unmeasured_ranks": [...],
//                 "alignment_error_ns": E, "alignment_error_us": E / 1000, "dropped": D,
//                 "clock": "...", "per_rank": [{"rank", "host", "clock_offset_ns",
//                 "clock_error_ns", "clock_measured", "clock_measurements", "clock_drift_ns",
//                 "recorded", "dropped", "capacity"}, ...]}
// A rank file whose clock was measured more than once (run/trace_session.h's resync(), and at
// the end) has each time shifted by the offset interpolated linearly between the measurements
// around it, held before the first and after the last (common/clock_map.h); a file with one
// offset (or one written before "clock_sync" existed) has its times as they were. A rank's
// clock_error_ns is the largest error bound among the measurements its times were mapped with,
// clock_offset_ns its start-up offset and clock_drift_ns how far its last measured offset moved
// from that one. E is the largest clock_error_ns of any rank: two events of different ranks are
// ordered correctly whenever they are more than 2E apart (while the drift between two
// measurements is linear).
//
// Inputs are untrusted (a crashed rank leaves nothing or an old file; a file may be truncated or
// not ours): each must be a regular file of at most maxFileBytes, one JSON document of nesting
// depth at most kMaxTraceDepth, in the format of common/trace_file.h, each event an object whose
// pid is the file's rank and whose ts (where present) is a finite number, its clock_sync (if
// any) at most maxClockSamples measurements of integers, in the order taken, with error
// bounds not negative; two files may not claim one rank. Anything else is an InvalidArgument, one
// line naming the file and what is wrong. Memory: one input file's document at a time; the output
// is streamed.
//
// Blocking; not thread-safe for one output path. The output is written atomically (a temporary
// renamed over outPath): SystemError if it cannot be.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shoal::run {

inline constexpr int kMaxTraceDepth = 16;

struct TraceMergeOptions {
  uint64_t maxFileBytes = uint64_t{1} << 30;  // per input file
  size_t maxClockSamples = size_t{1} << 16;   // "clock_sync" measurements per input file
  // The job's size, when known (the launcher knows it): ranks below it without a file are
  // reported as missing. 0: only gaps below the highest rank found are.
  int expectedRanks = 0;
};

struct TraceMergeSummary {
  int ranks = 0;                 // files merged
  uint64_t events = 0;           // events written, metadata events not counted
  int64_t alignmentErrorNs = 0;  // the largest clock error bound of any rank (above)
  uint64_t dropped = 0;          // spans the ranks' rings dropped, over all ranks
  std::vector<int> missingRanks;
  // Ranks whose clock offset was not measured (elastic jobs): aligned only if on rank 0's host.
  std::vector<int> unmeasuredRanks;
};

// One line for the launcher's output: "timeline of 4 ranks in job.json: clocks aligned within
// 14.1 us, 0 spans dropped" plus, where there are any, the missing and unmeasured ranks.
std::string describe(const TraceMergeSummary& summary, const std::string& outPath);

// Merges `rankFiles` (in any order) into `outPath`. InvalidArgument for an empty list.
TraceMergeSummary mergeTraces(const std::vector<std::string>& rankFiles, const std::string& outPath,
                              const TraceMergeOptions& options = {});

// The rank files in `dir`: names trace.rank<R>.json (as shoal::init() writes them), by rank.
// Temporaries and other files are ignored. InvalidArgument if `dir` cannot be listed.
std::vector<std::string> rankTraceFiles(const std::string& dir);

// mergeTraces(rankTraceFiles(dir), outPath, options); InvalidArgument if there are none.
TraceMergeSummary mergeTraceDir(const std::string& dir, const std::string& outPath,
                                const TraceMergeOptions& options = {});

}  // namespace shoal::run
