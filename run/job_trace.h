// The timeline of a `shoal run` job (README "Timeline"), as the launcher keeps it: the folder
// its ranks write their trace files into, emptied before each attempt, and the merge into the
// one file the user asked for when the job ends, failed or not.
//
// Not thread-safe; used by the launcher's thread only. Blocking (file system only).
#pragma once

#include <string>

namespace shoal::run {

// Where the ranks of a job traced into `tracePath` write their files: the path made absolute,
// with ".ranks" appended (every rank gets it as SHOAL_TRACE). Pure.
std::string traceRanksDir(const std::string& tracePath);

// Creates `dir` and removes the rank files of an earlier job or attempt there (a rank that dies
// writes none, and an old one must not be merged in its place). InvalidArgument ("--trace: ...")
// if it cannot be created.
void prepareTraceRanksDir(const std::string& dir);

// Merges the rank files into `tracePath` (run/trace_merge.h) and says so in one line on stderr.
// `expectedRanks` > 0: ranks below it without a file are named missing (elastic jobs pass 0:
// their membership changes). A failure to merge is said in that line, never thrown: it must not
// change the job's exit code.
void mergeJobTrace(const std::string& tracePath, int expectedRanks) noexcept;

}  // namespace shoal::run
