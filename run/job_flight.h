// The flight recorders of a job's ranks, as `shoal run` keeps them (README "Flight recorder"):
// the folder every rank records into, emptied before each attempt, and after an attempt that
// failed, who was where (run/flight_report.h) on the launcher's stderr.
//
// Not thread-safe; used by launch() only. Blocking (file system only).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "run/launcher.h"

namespace shoal::run {

class JobFlight {
 public:
  // options.flightEvents 0: no recorders. options.flightDir empty: a new temporary folder when
  // every rank runs on this host, else no recorders (each host would write its own folder, out
  // of the launcher's reach). InvalidArgument if the folder cannot be made.
  explicit JobFlight(const LaunchOptions& options);
  // Removes a temporary folder unless report() kept it.
  ~JobFlight();
  JobFlight(const JobFlight&) = delete;
  JobFlight& operator=(const JobFlight&) = delete;

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  // SHOAL_FLIGHT_DIR (and SHOAL_FLIGHT_EVENTS where given) for every rank; none when disabled.
  std::vector<std::pair<std::string, std::string>> variables() const;
  // Before an attempt: removes the rank files of an earlier one.
  void prepare() const;
  // After an attempt that failed: prints the diagnosis of the `ranks` started at launch, and
  // keeps the folder. Never throws (a file that cannot be read is said instead).
  void report(int ranks);

 private:
  std::string dir_;
  int events_ = -1;
  bool temporary_ = false;
  bool keep_ = false;
};

}  // namespace shoal::run
