#include "run/sweep/trial_process.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>

#include "run/spawner.h"

namespace shoal::run::sweep {

TrialProcess::TrialProcess(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env, const std::string& logPath) {
  SpawnOptions o;
  o.argv = argv;
  o.env = env;
  o.out = StreamMode::kFile;
  o.err = StreamMode::kFile;
  o.outputFile = logPath;
  SpawnedProcess p = spawn(o);
  pid_ = p.pid;
  try {
    pidfd_ = openPidFd(pid_);
  } catch (...) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    throw;
  }
}

TrialProcess::~TrialProcess() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  int status = 0;
  // SIGKILL cannot be caught: the wait is as short as the kernel's teardown.
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

std::optional<int> TrialProcess::reap() {
  if (reaped_) return std::nullopt;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) return std::nullopt;
  reaped_ = true;
  // The group may outlive its leader (a grandchild that ignored SIGTERM): it goes too.
  ::kill(-pid_, SIGKILL);
  return status;
}

void TrialProcess::terminate(double graceSeconds) {
  if (killAt_ || reaped_) return;
  ::kill(-pid_, SIGTERM);
  killAt_ = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                     std::chrono::duration<double>(graceSeconds));
}

std::optional<SteadyClock::time_point> TrialProcess::killDeadline() const {
  if (!killAt_ || killed_ || reaped_) return std::nullopt;
  return killAt_;
}

void TrialProcess::escalate(SteadyClock::time_point now) {
  if (killAt_ && !killed_ && !reaped_ && now >= *killAt_) {
    ::kill(-pid_, SIGKILL);
    killed_ = true;
  }
}

}  // namespace shoal::run::sweep
