// The launcher's side of an elastic job (`shoal run --elastic MIN:MAX`): which worker processes
// the job has, and when it gets new ones. The workers agree on their views among themselves
// (comm/membership.h); this decides which processes exist for them to agree about:
// - member ids: the launch's workers are members 0..n-1, each worker started later (a restart or
//   growth) gets the next id, always below kFirstOutsideMember (run/join_file.h);
// - restarts: Note [Elastic failures]: a failed worker does not stop the others; it is started
//   again as a new member while --max-restarts allows, on its own slot while that is offered,
//   else on a free one (Note [Failed slots], run/slot_pool.h);
// - host discovery (run/host_discovery.h): Note [Host discovery];
// - the join file (run/join_file.h): written once the store is up, removed with the supervisor;
// - the outcome: the job succeeds when MIN workers finished.
//
// Ownership: the launcher owns the processes and its records of them (LaunchedRank, the base of
// its own record); the supervisor keeps pointers to the records it is given, so they must stay
// where they are while it lives (the launcher keeps them in a deque that only grows). It starts
// no process itself: it asks the launcher to, through the StartWorker given to supervise(). It
// signals the process groups of workers whose slot left (SIGTERM with SIGCONT, then SIGKILL
// after the grace period) and reaps nothing (the launcher reaps its children by pid).
//
// Threading: not thread-safe; the launcher's one thread. supervise() never blocks.
//
// Errors: InvalidArgument, one line, for options that do not fit an elastic job (from the
// constructor and checkLaunch(), before anything starts), and from supervise() when the member
// ids run out; what HostDiscovery and StartWorker throw passes through. Progress lines go to the
// Say given at construction.
#pragma once

#include <fmt/format.h>
#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/membership.h"
#include "common/deadline.h"
#include "run/host_discovery.h"
#include "run/hosts.h"
#include "run/join_file.h"
#include "run/launcher.h"
#include "run/slot_pool.h"

namespace shoal::run {

// What the launcher knows of one rank it started, as far as the supervisor needs it; the
// launcher's own record (its output, its log) extends it. The launcher keeps pid, running and
// status current; the supervisor sets removed and killAt.
struct LaunchedRank {
  int rank = 0;    // its slot: an index into the job's placements
  int member = 0;  // elastic jobs: its member id (the rank, then one new id per start)
  Placement where;
  pid_t pid = -1;  // also its process group
  bool running = false;
  int status = 0;  // waitpid's, once it ended
  // Elastic jobs: stopped because host discovery no longer lists its slot (SIGKILL at killAt).
  bool removed = false;
  Clock::time_point killAt;
};

class ElasticSupervisor {
 public:
  using Say = std::function<void(const std::string& line)>;
  // Starts a worker on slot `rank` of the job's placements as `member`, and hands its record to
  // started().
  using StartWorker = std::function<void(int rank, int member)>;

  // `options.elastic` is set. Parses the range; with a host discovery script, runs it once
  // (blocking, with `childMask` for the program) for the hosts the job starts on.
  // InvalidArgument for a malformed range, a discovery script with --hosts, a program that is
  // not found, or a first run that lists no usable host.
  ElasticSupervisor(const LaunchOptions& options, const sigset_t& childMask, Say say);
  // Removes the join file it wrote: a worker started with it now would wait for a job that is
  // gone.
  ~ElasticSupervisor();
  ElasticSupervisor(const ElasticSupervisor&) = delete;
  ElasticSupervisor& operator=(const ElasticSupervisor&) = delete;

  // With host discovery: `hosts` becomes what its first run listed, and a `ranks` of 0 (one per
  // slot) becomes their slots, at most MAX. Without: both stay.
  void chooseLaunch(std::vector<HostSlots>& hosts, int& ranks) const;
  // The launch places `ranks` slots, of which the last `servers` would serve. InvalidArgument
  // when there are servers, or when the workers fall outside MIN..MAX.
  void checkLaunch(int ranks, int servers);

  // --join-file: writes `job` (the variables every worker gets but its slot's) there, once.
  void writeJoinFile(const Variables& job);

  // The launcher started `r` (before its process exists: the slot is taken from now on).
  void started(LaunchedRank& r);
  // `r` ended (the launcher reaped it; `stopping`: the job is being stopped). True when the end
  // is the supervisor's business (said, or a restart queued for supervise()); false when the
  // launcher's own failure handling applies.
  bool ended(LaunchedRank& r, bool failed, bool stopping);

  // Once per turn of the launcher's loop: restarts the workers that failed since the last turn,
  // kills removed workers whose grace has passed, and acts on a finished discovery run (stops the
  // workers of slots that left; starts workers on free slots, up to MAX, until one worker
  // finished). New slots are appended to `places`.
  void supervise(std::vector<Placement>& places, bool stopping, const StartWorker& start);

  // The running discovery program's output for the launcher's poll(2); -1: none runs.
  int discoveryFd() const { return discovery_ ? discovery_->fd() : -1; }

  // The job's exit code once every worker ended: 0 when at least MIN finished (exited 0), else
  // the first failed worker's.
  int finish() const;

 private:
  template <typename... Args>
  void say(fmt::format_string<Args...> f, Args&&... args) const {
    say_(fmt::format(f, std::forward<Args>(args)...));
  }
  int newMember();
  void restartFailed(std::vector<Placement>& places, const StartWorker& start);
  int slotForRestart(const LaunchedRank& f, std::vector<Placement>& places);
  void discover(std::vector<Placement>& places, bool stopping, const StartWorker& start);

  const std::string text_;  // "MIN:MAX" as given
  const comm::ElasticRange range_;
  const int maxRestarts_;
  const double graceSeconds_;
  const bool verbose_;
  const std::string joinFile_;
  Say say_;
  bool joinFileWritten_ = false;         // written by this job, so removed by it
  int nextMember_ = 0;                   // 0..n-1 went to the launch's workers, then one per start
  bool finishing_ = false;               // a worker exited 0: no new workers
  std::vector<LaunchedRank*> workers_;   // in the order started
  std::vector<LaunchedRank*> failures_;  // Note [Elastic failures], in the order seen
  size_t reported_ = 0;                  // failures_ said and acted on
  int restarts_ = 0;
  // Host discovery (Note [Host discovery]).
  std::unique_ptr<HostDiscovery> discovery_;
  SlotPool slots_;  // what discovery offers, and which slots are taken or failed
  std::string lastDiscoveryError_;
};

}  // namespace shoal::run
