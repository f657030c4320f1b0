// One trial's running job: the process started through run/spawner.h (its own process group;
// killed with the sweep's main thread by PR_SET_PDEATHSIG, so a SIGKILLed sweep leaves no trial
// behind), its output in the trial's log file, and its stop: SIGTERM to the process group, then
// SIGKILL once the grace has passed.
//
// Nothing here blocks for long: exit is observed through pollFd() (a pidfd, readable once the
// process has exited) in the sweep's poll(2), and escalate() is called when the deadline
// killDeadline() returns comes. Not thread-safe; create, poll and destroy from the sweep's
// main thread (the spawning thread; see spawner.h on PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/socket.h"

namespace shoal::run::sweep {

using SteadyClock = std::chrono::steady_clock;

class TrialProcess {
 public:
  // Starts `argv` with the whole environment `env`, stdout and stderr to `logPath`. Throws as
  // spawn() does (InvalidArgument for a program not found, SystemError).
  TrialProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               const std::string& logPath);
  // A process still running is killed (SIGKILL to its group) and reaped.
  ~TrialProcess();
  TrialProcess(const TrialProcess&) = delete;
  TrialProcess& operator=(const TrialProcess&) = delete;

  int pollFd() const { return pidfd_.get(); }
  pid_t pid() const { return pid_; }

  // The wait status once the process has exited (pollFd() readable), else nullopt. Never blocks.
  std::optional<int> reap();

  // Asks the job to stop: SIGTERM to its process group now, SIGKILL at now + grace (from
  // escalate()). A second call does nothing.
  void terminate(double graceSeconds);
  bool terminating() const { return killAt_.has_value(); }
  // When escalate() has to run next, if a stop is under way and SIGKILL not yet sent.
  std::optional<SteadyClock::time_point> killDeadline() const;
  // Sends SIGKILL if the grace is over.
  void escalate(SteadyClock::time_point now);

 private:
  pid_t pid_ = -1;
  Fd pidfd_;
  bool reaped_ = false;
  bool killed_ = false;
  std::optional<SteadyClock::time_point> killAt_;
};

}  // namespace shoal::run::sweep
