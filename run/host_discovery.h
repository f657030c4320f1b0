// Host discovery for elastic jobs (`shoal run --elastic MIN:MAX --host-discovery-script PROG`,
// in the spirit of Horovod's --host-discovery-script): a program of the user's prints the hosts
// the job may use now, one per line in hostfile syntax ("host", "host:4", "host slots=4"), and
// exits 0. The launcher runs it at start-up, then again every interval while the job runs, and
// grows or shrinks the job to what it lists.
//
// The program is untrusted input: it runs with a deadline (killed, with whatever it started,
// when it overruns), its output is bounded (64 KiB), and a run that fails, overruns or prints
// something malformed is reported as one line naming the program; it never changes the hosts.
//
// Threading: one thread (the launcher's). The program is started through run/spawner.h (its own
// process group; killed with the launcher) and reaped here by its pid: the caller must not reap
// it (reap its own children by pid, not with waitpid(-1)).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "run/hosts.h"

namespace shoal::run {

struct HostDiscoveryOptions {
  std::string program;                          // a path or a name on PATH; run with no arguments
  Duration interval = std::chrono::seconds(1);  // between the end of a run and the next start
  Duration timeout = std::chrono::seconds(30);  // one run's bound
  sigset_t signalMask{};                        // the program's (the launcher's original mask)
};

// The end of one run: the hosts it listed (a host listed twice: its slots add up), or why the
// run is void.
struct DiscoveryResult {
  std::vector<HostSlots> hosts;
  std::optional<std::string> error;  // one line; `hosts` is empty then
};

class HostDiscovery {
 public:
  explicit HostDiscovery(HostDiscoveryOptions options);
  // Kills a run still going (its process group) and reaps it.
  ~HostDiscovery();
  HostDiscovery(const HostDiscovery&) = delete;
  HostDiscovery& operator=(const HostDiscovery&) = delete;

  // Runs the program now and waits for it (at most the timeout). Blocking. InvalidArgument (one
  // line) when the run fails, overruns, prints something malformed or lists no host: the job
  // cannot start without hosts.
  std::vector<HostSlots> runNow();

  // Non-blocking: starts a run when none is going and the interval has passed since the last
  // one ended; reads what the running one printed; returns its result once it has exited (or
  // was killed for overrunning). Call it whenever fd() is readable and at least every few
  // hundred milliseconds.
  std::optional<DiscoveryResult> poll();

  // The running program's stdout, for the caller's poll(2); -1 when none runs.
  int fd() const { return out_.valid() ? out_.get() : -1; }

 private:
  void start();
  std::optional<DiscoveryResult> finishIfExited();
  DiscoveryResult parse(int status) const;

  HostDiscoveryOptions options_;
  pid_t pid_ = -1;
  Fd out_;
  std::string output_;
  bool tooLong_ = false;
  Clock::time_point startedAt_{}, nextAt_{};
};

}  // namespace shoal::run
