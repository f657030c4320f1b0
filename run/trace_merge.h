// One timeline for a whole job: the per-rank trace files (common/trace_file.h) merged into one
// Chrome trace / Perfetto JSON file (chrome://tracing, ui.perfetto.dev), as `shoal run --trace`
// writes it.
//
// The output: every rank's events as they were (times already on rank 0's clock), a
// "process_name" ("rank R (host)") and "process_sort_index" metadata event per rank, and
//   "otherData": {"shoal_trace": 1, "ranks": N, "rank_list": [...], "missing_ranks": [...],
//                 "unmeasured_ranks": [...],
//                 "alignment_error_ns": E, "alignment_error_us": E / 1000, "dropped": D,
//                 "clock": "...", "per_rank": [{"rank", "host", "clock_offset_ns",
//                 "clock_error_ns", "clock_measured", "recorded", "dropped", "capacity"}, ...]}
// where E is the largest clock error bound of any rank: two events of different ranks are
// ordered correctly whenever they are more than 2E apart.
//
// Inputs are untrusted (a crashed rank leaves nothing or an old file; a file may be truncated or
// not ours): each must be a regular file of at most maxFileBytes, one JSON document of nesting
// depth at most kMaxTraceDepth, in the format of common/trace_file.h, each event an object whose
// pid is the file's rank and whose ts (where present) is a finite number; two files may not
// claim one rank. Anything else is an InvalidArgument, one line naming the file and what is
// wrong. Memory: one input file's document at a time; the output is streamed.
//
// Blocking; not thread-safe for one output path. The output is written atomically (a temporary
// renamed over outPath): SystemError if it cannot be.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::run {

inline constexpr int kMaxTraceDepth = 16;

struct TraceMergeOptions {
  uint64_t maxFileBytes = uint64_t{1} << 30;  // per input file
  // The job's size, when known (the launcher knows it): ranks below it without a file are
  // reported as missing. 0: only gaps below the highest rank found are.
  int expectedRanks = 0;
};

struct TraceMergeSummary {
  int ranks = 0;                 // files merged
  uint64_t events = 0;           // events written, metadata events not counted
  int64_t alignmentErrorNs = 0;  // the largest clock error bound of any rank
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
