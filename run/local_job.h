// Starts N ranks of a program on this machine: hosts the job's TCP store, generates the job
// secret, and spawns each rank with SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE_ADDR and
// SHOAL_SECRET set. The seed of `shoal run`; used by the demo, the process tests and benches.
//
// Ranks are started by run/spawner.h: each in its own process group, killed if the thread that
// built the job ends (parent-death signal), stdin /dev/null, no inherited descriptors.
//
// Not thread-safe; build and use a job on one thread that outlives it. The destructor kills
// (SIGKILL) and reaps every rank still running, with its process group, so no process outlives
// the job; a rank's process group is also killed when the rank is reaped.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "store/tcp_store.h"

namespace shoal::run {

struct LocalJobOptions {
  int ranks = 1;
  std::vector<std::string> argv;                         // argv[0] is the program path
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every rank
  // If set, each rank's stdout+stderr go to <outputDir>/rank<r>.log instead of the terminal.
  std::string outputDir;
  // False: the ranks get no SHOAL_RANK / SHOAL_WORLD_SIZE / SHOAL_STORE_ADDR / SHOAL_SECRET (and
  // no store is hosted): for tests that play another launcher (Slurm, Kubernetes) through
  // `rankEnv`.
  bool shoalVariables = true;
  std::function<std::vector<std::pair<std::string, std::string>>(int rank)> rankEnv;
};

struct RankExit {
  int rank = 0;
  int exitCode = -1;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  bool ok() const { return signal == 0 && exitCode == 0; }
  std::string describe() const;
};

class LocalJob {
 public:
  // Starts every rank. Throws InvalidArgument (no ranks, program not executable) or SystemError
  // (a rank could not be started: the ranks already started are killed first).
  explicit LocalJob(LocalJobOptions options);
  ~LocalJob();
  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  pid_t pid(int rank) const { return pids_.at(rank); }
  std::string storeAddress() const;

  // Sends `sig` to one rank's process group (the rank and whatever it started). Does nothing
  // once the rank has been reaped (its pid may belong to someone else by then).
  void signal(int rank, int sig);

  // Waits (blocking in poll(2), no sleeping) for every rank to exit. Ranks still running at the
  // deadline are killed, stopped ones too, and reported with their signal; `timedOut` (if
  // given) says whether that happened.
  std::vector<RankExit> wait(Duration timeout, bool* timedOut = nullptr);

  // Non-blocking: the rank's exit if it has exited (reaping it), else nothing.
  std::optional<RankExit> poll(int rank);

  // The captured output of a rank (with outputDir set).
  std::string output(int rank) const;

 private:
  LocalJobOptions options_;
  std::unique_ptr<store::TcpStoreServer> store_;
  void startRanks(const std::vector<std::string>& baseEnv, const std::string& secret);
  void killUnreaped();

  std::vector<pid_t> pids_;  // each also the rank's process group id
  std::vector<Fd> pidFds_;   // pidfd per rank: readable once it exited
  std::vector<RankExit> exits_;
  std::vector<bool> reaped_;
};

// Runs this very program (/proc/self/exe) as `ranks` local processes with `args` and `env`,
// waits up to `timeout`, prints a line to stderr for each rank that failed, and returns 0 if
// all succeeded, 1 otherwise. For programs that launch themselves when started plainly.
int runSelfLocally(int ranks, const std::vector<std::string>& args,
                   const std::vector<std::pair<std::string, std::string>>& env, Duration timeout);

}  // namespace shoal::run
