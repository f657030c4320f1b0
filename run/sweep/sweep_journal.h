// A sweep directory's state, so an interrupted sweep resumes where it stopped:
//
//   DIR/sweep.json    the configuration (as given) with the algorithm and seed in force;
//                     written once, compared on resume
//   DIR/trials.jsonl  the journal: one JSON line per event, appended with one write(2) and
//                     fdatasync'd before the sweep goes on:
//                       {"event":"start","trial":3,"params":{"lr":0.01,"optimizer":"adam"}}
//                       {"event":"end","trial":3,"params":{...},"status":"completed",
//                        "metric":0.84,"curve":[[1,0.80],[2,0.84]],"seconds":7.2,
//                        "exit_code":0,"reason":"","started_ms":...,"ended_ms":...}
//                     with --hosts, both events also name where the trial ran (its `shoal run
//                     --hosts`, and its slots in rank order; absent for local trials):
//                       "hosts":"nodeA:2,nodeB:1","slots":"nodeA:0,nodeA:1,nodeB:0"
//
// A trial with a start but no end was interrupted (the sweep was killed): a resumed sweep runs
// it again with the same parameters. The journal is untrusted on reading: the file at most
// kMaxJournalBytes, each line at most kMaxJournalLineBytes; a torn last line (a crash mid-write)
// and lines that do not parse, or whose parameters do not fit the configuration, are skipped
// and counted. Not thread-safe; appends block on the disk (fdatasync).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/socket.h"
#include "run/sweep/search_space.h"
#include "run/sweep/trial_metrics.h"

namespace shoal::run::sweep {

inline constexpr uint64_t kMaxJournalBytes = 256 << 20;
inline constexpr size_t kMaxJournalLineBytes = 1 << 20;

enum class TrialStatus {
  kCompleted,  // exited 0 having reported the metric
  kFailed,     // exited non-zero, or without reporting the metric
  kPruned,     // stopped early by ASHA
  kTimedOut,   // stopped by the trial's or the sweep's time limit
};
std::string_view toString(TrialStatus s);

struct TrialRecord {
  int id = 0;
  Assignment params;
  TrialStatus status = TrialStatus::kFailed;
  double metric = 0;  // at the last epoch reported; NaN when none
  std::vector<EpochValue> curve;
  double seconds = 0;
  int exitCode = -1;                   // -1: not known
  std::string reason;                  // why it failed or stopped (empty when completed)
  int64_t startedMs = 0, endedMs = 0;  // Unix time, milliseconds
  // With --hosts: where it ran ("nodeA:2,nodeB:1") and its slots in rank order
  // ("nodeA:0,nodeA:1,nodeB:0"); empty for a local trial (trial_slots.h).
  std::string hosts, slots;
};

// What a journal holds: the finished trials in the order they finished, and the interrupted
// ones (by id) with their parameters.
struct JournalContents {
  std::vector<TrialRecord> finished;
  std::map<int, Assignment> interrupted;
  int skippedLines = 0;
};

class SweepJournal {
 public:
  // Opens (creating) `path` for appending. SystemError naming it if it cannot.
  explicit SweepJournal(std::string path);
  // `hosts` and `slots` as in TrialRecord (empty: a local trial, not written).
  void started(const SweepConfig& config, int trial, const Assignment& params,
               const std::string& hosts = "", const std::string& slots = "");
  void finished(const SweepConfig& config, const TrialRecord& record);

 private:
  void append(const std::string& line);
  std::string path_;
  Fd fd_;
};

// Reads `path` (a missing file: empty contents). SystemError when it cannot be read,
// InvalidArgument when it is larger than kMaxJournalBytes.
JournalContents readJournal(const std::string& path, const SweepConfig& config);

// DIR/sweep.json: the configuration text and what the command line set.
struct SweepRecord {
  std::string configJson;  // the configuration as given (JSON text)
  Algorithm algorithm = Algorithm::kTpe;
  uint64_t seed = 0;
  // --trial-time-limit when it was given (0: none), kept so a resumed sweep bounds its trials
  // as the first run did; nullopt: the configuration's limit.
  std::optional<double> trialTimeLimit;
};
void writeSweepRecord(const std::string& dir, const SweepRecord& record);
// nullopt when DIR/sweep.json does not exist; InvalidArgument when it is not a sweep record.
std::optional<SweepRecord> readSweepRecord(const std::string& dir);
// True when both records describe the same sweep: the same configuration as JSON values (any
// spacing or key order; "trials", "parallel", "time_limit" and "trial_time_limit" may differ, as
// may the records' trialTimeLimit: the budget can change on a resume), the same algorithm and
// seed.
bool sameSweep(const SweepRecord& a, const SweepRecord& b);

}  // namespace shoal::run::sweep
