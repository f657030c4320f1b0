// Which rank a failed job's summary blames: the launcher's policy, apart from the processes it
// watches so that it can be tested alone (tests/failure_blame_test.cpp).
//
// Exits arrive without an order (a remote rank's exit even travels through ssh), so the
// launcher collects the failures of a settling window and then chooses: preferably a rank
// killed by a signal (its peers fail because it vanished), else the lowest rank among those
// that failed of their own accord. A rank whose world group aborted because of another rank
// that also failed (its abort record in the job's store names that rank: Note [Root cause] in
// comm/native/native_engine.cpp) is a victim, and is blamed only when every failed rank is one.
// Note [Stopped ranks]: a stopped rank (SIGSTOP, SIGTSTP) neither exits nor answers, so its peers
// fail when their operation times out, each naming it as the silent rank; the first of them to exit
// is not the cause. A local rank that was stopped at or before the first failure and is still
// stopped is blamed instead, the earliest stopped one if several. A stopped remote rank is
// invisible to the launcher (its child there is ssh); then the first failed rank is named, and its
// output names the silent one.
//
// Pure; no threads, no system calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

namespace shoal::run {

// A rank that failed while the job was running (not once the launcher was stopping it).
struct RankFailure {
  int rank = 0;
  int status = 0;     // waitpid's
  bool local = true;  // a remote rank's status is ssh's: 128 + N for a signal N
  std::chrono::steady_clock::time_point at;  // when its failing exit was seen
  // The rank its abort record names as where its group's failure started; -1: no record.
  int cause = -1;
};

// A local rank that is stopped and still running.
struct RankStop {
  int rank = 0;
  std::chrono::steady_clock::time_point since;
};

struct Blame {
  size_t firstFailed = 0;         // index into the failures: the one chosen as the first
  std::optional<size_t> stopped;  // index into the stops: blamed instead (Note [Stopped ranks])
};

// `failures` must not be empty (InvalidArgument otherwise).
Blame blameFailure(const std::vector<RankFailure>& failures, const std::vector<RankStop>& stops);

}  // namespace shoal::run
