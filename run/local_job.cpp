#include "run/local_job.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "run/process_util.h"
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
  if (options_.shoalVariables) store_ = std::make_unique<store::TcpStoreServer>("127.0.0.1", 0);
  const std::string secret = transport::generateSecret();

  // The job's own variables replace whatever the caller's environment had.
  std::vector<std::string> baseEnv =
      environmentWithout({"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_STORE_ADDR", "SHOAL_SECRET"});
  for (auto& [k, v] : options_.env) baseEnv.push_back(k + "=" + v);

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
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (auto& s : options_.argv) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string log;
    if (!options_.outputDir.empty()) {
      log = fmt::format("{}/rank{}.log", options_.outputDir, r);
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    pid_t pid = 0;
    int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      SHOAL_THROW(SystemError, "cannot start rank {} ({}): {}", r, options_.argv[0],
                  std::strerror(rc));
    }
    pids_.push_back(pid);
  }
  exits_.resize(pids_.size());
  reaped_.assign(pids_.size(), false);
}

LocalJob::~LocalJob() {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    ::kill(pids_[r], SIGKILL);
    ::waitpid(pids_[r], nullptr, 0);
  }
}

std::string LocalJob::storeAddress() const {
  return fmt::format("127.0.0.1:{}", store_->port());
}

void LocalJob::signal(int rank, int sig) {
  ::kill(pids_.at(rank), sig);
}

std::vector<RankExit> LocalJob::wait(Duration timeout, bool* timedOut) {
  Deadline deadline(timeout);
  if (timedOut) *timedOut = false;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    bool all = true;
    for (size_t r = 0; r < pids_.size(); ++r) all = poll(static_cast<int>(r)).has_value() && all;
    if (all) return exits_;
    if (deadline.expired()) {
      if (timedOut) *timedOut = true;
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (!reaped_[r]) {
          ::kill(pids_[r], SIGKILL);
          ::kill(pids_[r], SIGCONT);
        }
      }
      return wait(std::chrono::seconds(10), nullptr);
    }
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

std::optional<RankExit> LocalJob::poll(int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (!reaped_.at(r)) {
    int status = 0;
    if (::waitpid(pids_[r], &status, WNOHANG) != pids_[r]) return std::nullopt;
    reaped_[r] = true;
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
