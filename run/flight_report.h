// Who was where: every rank's flight recorder (common/flight_recorder.h) read together, and the
// first operation on which the ranks of a group disagree (README "Flight recorder").
//
// `shoal flight DIR` prints describe(diagnoseFlightDir(DIR)); `shoal run` prints it when a job
// fails.
//
// How the first desynchronised operation is found: the entries of each group (its label and
// generation) are lined up by sequence number, from the newest first sequence number any rank
// still holds (rings overwrite their oldest entries). At the first sequence number where the
// members disagree, one of:
//   - some members never started it (a rank skipped a collective, or stopped before it): they
//     are named, with their last operation in the group and whether their process ended;
//   - members ran different operations or sizes (a rank called another collective): the ranks
//     of each kind are named, and where a rank's operation is the others' next one, it is said
//     to have skipped;
//   - all started the same operation but not all completed it: where it failed first (the
//     earliest error) and who is still in it.
// Where several groups disagree, the disagreement that started first (wall clock) is named.
//
// Inputs are untrusted (readFlightFile's checks); two files may not claim one rank. Blocking;
// InvalidArgument for what cannot be read, one line naming the file.
#pragma once

#include <string>
#include <vector>

#include "common/flight_recorder.h"

namespace shoal::run {

struct FlightDiagnosis {
  std::vector<FlightFile> files;  // by rank
  std::vector<int> missingRanks;  // below the expected size, without a file
  // One line naming the first desynchronised operation, or empty where every group's
  // operations agree on all ranks.
  std::string desync;
  // The group, sequence number and ranks it names (group empty where desync is).
  std::string group;
  uint64_t seq = 0;
  std::vector<int> culprits;  // the ranks that differ from the others
};

// The recorder files in `dir` (names flight.rank<R>), by rank. InvalidArgument if `dir` cannot
// be listed.
std::vector<std::string> flightFiles(const std::string& dir);

// Reads and analyses the files. `expectedRanks` > 0: ranks below it without a file are missing.
FlightDiagnosis diagnoseFlight(const std::vector<std::string>& files, int expectedRanks = 0);
// diagnoseFlight(flightFiles(dir), ...); InvalidArgument if there are none.
FlightDiagnosis diagnoseFlightDir(const std::string& dir, int expectedRanks = 0);

// Several lines: the first desynchronised operation (or that there is none), then each rank's
// last operation with its state, and how its process ended.
std::string describe(const FlightDiagnosis& diagnosis);

}  // namespace shoal::run
