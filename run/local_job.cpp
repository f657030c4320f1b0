#include "run/local_job.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "run/process_util.h"
#include "run/spawner.h"
#include "transport/auth.h"

namespace shoal::run {

std::string RankExit::describe() const {
  if (signal)
    return fmt::format("rank {} killed by signal {} ({})", rank, signal, strsignal(signal));
  return fmt::format("rank {} exited with code {}", rank, exitCode);
}

LocalJob::LocalJob(LocalJobOptions options) : options_(std::move(options)) {
  SHOAL_CHECK(options_.ranks >= 1, "a job needs at least one rank, got {}", options_.ranks);
  SHOAL_CHECK(!options_.argv.empty(), "a job needs a program");
  if (::access(options_.argv[0].c_str(), X_OK) != 0) {
    SHOAL_THROW(InvalidArgument, "program '{}' not found or not executable", options_.argv[0]);
  }
  const std::string secret = transport::generateSecret();
  if (options_.shoalVariables) {
    store::TcpStoreServerOptions so;
    so.secret = secret;  // the ranks get it as SHOAL_SECRET
    // encrypt stays auto: on loopback it allows both, so the ranks' SHOAL_ENCRYPT decides.
    store_ = std::make_unique<store::TcpStoreServer>("127.0.0.1", 0, so);
  }

  // The job's own variables, and those the caller set for it, replace whatever the caller's
  // environment had (a duplicate would leave the choice to the rank's getenv).
  std::vector<std::string> replaced{"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_STORE_ADDR",
                                    "SHOAL_SECRET"};
  for (auto& [k, v] : options_.env) replaced.push_back(k);
  std::vector<std::string> baseEnv = environmentWithout(replaced);
  for (auto& [k, v] : options_.env) baseEnv.push_back(k + "=" + v);

  exits_.resize(static_cast<size_t>(options_.ranks));
  reaped_.assign(static_cast<size_t>(options_.ranks), false);
  try {
    startRanks(baseEnv, secret);
  } catch (...) {
    // The destructor does not run for a half-built job: stop the ranks already started.
    killUnreaped();
    throw;
  }
}

void LocalJob::startRanks(const std::vector<std::string>& baseEnv, const std::string& secret) {
  for (int r = 0; r < options_.ranks; ++r) {
    std::vector<std::string> env = baseEnv;
    if (options_.shoalVariables) {
      env.push_back(fmt::format("SHOAL_RANK={}", r));
      env.push_back(fmt::format("SHOAL_WORLD_SIZE={}", options_.ranks));
      env.push_back("SHOAL_STORE_ADDR=" + storeAddress());
      env.push_back("SHOAL_SECRET=" + secret);
    }
    if (options_.rankEnv) {
      for (auto& [k, v] : options_.rankEnv(r)) env.push_back(k + "=" + v);
    }
    SpawnOptions spawnOptions;
    spawnOptions.argv = options_.argv;
    spawnOptions.env = std::move(env);
    if (!options_.outputDir.empty()) {
      spawnOptions.out = spawnOptions.err = StreamMode::kFile;
      spawnOptions.outputFile = fmt::format("{}/rank{}.log", options_.outputDir, r);
    }
    SpawnedProcess child;
    try {
      child = spawn(spawnOptions);
    } catch (const SystemError& e) {
      SHOAL_THROW(SystemError, "cannot start rank {}: {}", r, e.what());
    }
    pids_.push_back(child.pid);
    // Readable when the rank exits: wait() blocks in poll(2) on these instead of sleeping.
    pidFds_.push_back(openPidFd(child.pid));
  }
}

LocalJob::~LocalJob() {
  killUnreaped();
}

void LocalJob::killUnreaped() {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    ::kill(-pids_[r], SIGKILL);
    ::waitpid(pids_[r], nullptr, 0);
    reaped_[r] = true;
  }
}

std::string LocalJob::storeAddress() const {
  return fmt::format("127.0.0.1:{}", store_->port());
}

void LocalJob::signal(int rank, int sig) {
  const size_t r = static_cast<size_t>(rank);
  // A reaped rank's pid (and group id) may already belong to another process.
  if (!reaped_.at(r)) ::kill(-pids_[r], sig);
}

std::vector<RankExit> LocalJob::wait(Duration timeout, bool* timedOut) {
  Deadline deadline(timeout);
  if (timedOut) *timedOut = false;
  for (;;) {
    std::vector<pollfd> fds;
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (!poll(static_cast<int>(r))) fds.push_back({pidFds_[r].get(), POLLIN, 0});
    }
    if (fds.empty()) return exits_;
    if (deadline.expired()) break;
    // Bounded by the deadline; a pidfd turns readable when its process exits.
    const int ms = static_cast<int>(std::min<int64_t>(
        std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()).count(), 1 << 30));
    if (::poll(fds.data(), fds.size(), std::max(ms, 1)) < 0 && errno != EINTR) {
      throwSystemError("poll", errno);
    }
  }
  if (timedOut) *timedOut = true;
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (!reaped_[r]) {
      ::kill(-pids_[r], SIGKILL);
      ::kill(-pids_[r], SIGCONT);  // a stopped rank acts on SIGKILL only once continued
    }
  }
  // SIGKILL cannot be ignored: they go within moments, 10 s is a generous bound.
  return wait(std::chrono::seconds(10), nullptr);
}

std::optional<RankExit> LocalJob::poll(int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (!reaped_.at(r)) {
    int status = 0;
    if (::waitpid(pids_[r], &status, WNOHANG) != pids_[r]) return std::nullopt;
    reaped_[r] = true;
    // Whatever the rank started goes with it (its process group; see run/spawner.h).
    ::kill(-pids_[r], SIGKILL);
    exits_[r].rank = rank;
    if (WIFSIGNALED(status)) {
      exits_[r].signal = WTERMSIG(status);
    } else {
      exits_[r].exitCode = WEXITSTATUS(status);
    }
  }
  return exits_[r];
}

std::string LocalJob::output(int rank) const {
  std::ifstream in(fmt::format("{}/rank{}.log", options_.outputDir, rank));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int runSelfLocally(int ranks, const std::vector<std::string>& args,
                   const std::vector<std::pair<std::string, std::string>>& env, Duration timeout) {
  char self[4096];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) throwSystemError("readlink /proc/self/exe", errno);
  LocalJobOptions o;
  o.ranks = ranks;
  o.argv = {std::string(self, static_cast<size_t>(len))};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = env;
  LocalJob job(o);
  bool timedOut = false;
  int failed = 0;
  for (auto& e : job.wait(timeout, &timedOut)) {
    if (!e.ok()) {
      std::fprintf(stderr, "%s%s\n", e.describe().c_str(),
                   timedOut ? " (the job ran out of time)" : "");
      failed = 1;
    }
  }
  return failed;
}

}  // namespace shoal::run
