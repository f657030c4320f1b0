// A job's run directory (README "Run directories"): one folder per job that says what ran and
// holds what it left, as `shoal run --run-dir DIR` keeps it:
//   run.json     the job: name, command, working directory, git revision, hosts, ranks, start
//                and end (wall clock), status ("running", then "succeeded" or "failed"), exit
//                code, attempts and configuration (run/run_configuration.h: the launcher's
//                options and SHOAL_* environment, secrets redacted); rewritten atomically at
//                the start and at the end
//   metrics.db   the ranks' metrics (track/metrics_store.h), opened by each rank's Tracker at
//                metricsPath(runDirectoryFromEnv())
//   flight/      the ranks' flight recorders (run/flight_report.h)
//
// The launcher side is RunDirectory (used by launch() only; not thread-safe); the rank side is
// runDirectoryFromEnv(). Blocking: file system only.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shoal::run {

struct LaunchOptions;

struct RunRecord {
  std::string name;  // the folder's name
  std::vector<std::string> command;
  std::string workingDirectory;
  std::optional<std::string> gitRevision;  // of the working directory's repository, if any
  std::vector<std::string> hosts;          // "host:slots"; empty: this machine
  int ranks = 0;                           // workers at launch (the job's -n)
  int servers = 0;
  std::optional<std::string> elastic;  // MIN:MAX
  int64_t startedNs = 0;               // wall clock
  int64_t endedNs = 0;                 // 0 while running
  std::string status = "running";      // running | succeeded | failed
  std::optional<int> exitCode;
  int attempts = 0;  // attempts started (restarts + 1)
  // run/run_configuration.h's object; null in a record written before it existed.
  nlohmann::json configuration;
};

// "metrics.db" in `dir`.
std::string metricsPath(const std::string& dir);

// The run directory the launcher gave this rank (SHOAL_RUN_DIR), if any.
std::optional<std::string> runDirectoryFromEnv();

// The revision checked out in the git repository holding `dir` (read from .git, no git
// program), or nullopt if there is none or it cannot be read.
std::optional<std::string> gitRevision(const std::string& dir);

// The record as run.json holds it (also what the dashboard serves).
nlohmann::json toJson(const RunRecord& record);

// Writes `record` to dir/run.json atomically. SystemError if it cannot.
void writeRunRecord(const std::string& dir, const RunRecord& record);
// Reads dir/run.json (untrusted: at most 1 MiB, the fields of RunRecord with their types).
// InvalidArgument, one line naming the file, for anything else.
RunRecord readRunRecord(const std::string& dir);

class RunDirectory {
 public:
  // Empty options.runDir: nothing (every call is a no-op). Else creates the folder and writes
  // the record of a running job. InvalidArgument if the folder cannot be made or already holds
  // a run (run.json): a run directory is never overwritten.
  explicit RunDirectory(const LaunchOptions& options);
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  // SHOAL_RUN_DIR for every rank; none when disabled.
  std::vector<std::pair<std::string, std::string>> variables() const;
  // Counts an attempt (each start of the job's ranks).
  void attemptStarted() { ++record_.attempts; }
  // Records the end: status, exit code, time, and the number of ranks started at launch where
  // known (> 0). Never throws (a failure to write is said on stderr).
  void finish(int exitCode, int ranks = 0) noexcept;

 private:
  std::string dir_;
  RunRecord record_;
};

}  // namespace shoal::run
