// A rank that is stopped (SIGSTOP) rather than killed: its peers time out, and `shoal run`'s
// summary must name the stopped rank as the cause, not the first peer whose timeout fired.
// Also the spawner both launchers use (run/spawner.h): process groups, no leaked descriptors,
// exec failures reported. Every wait here is on output or exit, bounded by a deadline.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "run/process_util.h"
#include "run/spawner.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

// A spawned process whose stdout and stderr are read through pipes as they arrive.
class Watched {
 public:
  explicit Watched(std::vector<std::string> argv) {
    run::SpawnOptions o;
    o.argv = std::move(argv);
    o.env = run::environmentWithout({});
    o.out = o.err = run::StreamMode::kPipe;
    auto p = run::spawn(o);
    pid_ = p.pid;
    out_ = std::move(p.out);
    err_ = std::move(p.err);
    pidFd_ = run::openPidFd(pid_);
  }
  ~Watched() {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return text_; }

  // Reads until `done(output)` holds or both streams end; false only at the deadline.
  bool readUntil(const std::function<bool(const std::string&)>& done, const Deadline& deadline) {
    while (!done(text_)) {
      std::vector<pollfd> fds;
      for (Fd* fd : {&out_, &err_}) {
        if (fd->valid()) fds.push_back({fd->get(), POLLIN, 0});
      }
      if (fds.empty()) return true;
      if (deadline.expired()) return false;
      if (::poll(fds.data(), fds.size(), std::max(1, deadline.remainingMs())) < 0 &&
          errno != EINTR) {
        throwSystemError("poll", errno);
      }
      for (auto& p : fds) {
        if (!p.revents) continue;
        char buf[4096];
        ssize_t got = ::read(p.fd, buf, sizeof(buf));
        if (got > 0) {
          text_.append(buf, static_cast<size_t>(got));
        } else if (got == 0 || errno != EINTR) {
          (p.fd == out_.get() ? out_ : err_).reset();
        }
      }
    }
    return true;
  }

  // The exit code (128 + signal when killed), or -1 if it is still running at the deadline.
  int wait(const Deadline& deadline) {
    pollfd p{pidFd_.get(), POLLIN, 0};
    while (::poll(&p, 1, std::max(1, deadline.remainingMs())) == 0) {
      if (deadline.expired()) return -1;
    }
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) throwSystemError("waitpid", errno);
    reaped_ = true;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

 private:
  pid_t pid_ = -1;
  Fd out_, err_, pidFd_;
  std::string text_;
  bool reaped_ = false;
};

// The child of `parent` whose environment has SHOAL_RANK=<rank>, or -1.
pid_t rankPid(pid_t parent, int rank) {
  const std::string want = fmt::format("SHOAL_RANK={}", rank);
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so start after ')'.
    const std::string stat = readFile(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = -1;
    if (std::sscanf(stat.c_str() + close + 1, " %*c %d", &ppid) != 1 || ppid != parent) continue;
    const std::string env = readFile(e.path().string() + "/environ");
    for (size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
      if (env.compare(at, want.size() + 1, want + '\0') == 0) return std::stoi(name);
      if (env.find('\0', at) == std::string::npos) break;
    }
  }
  return -1;
}

TEST(LauncherStop, TheSummaryNamesTheStoppedRankNotTheFirstToTimeOut) {
  constexpr int kTimeout = 3;  // SHOAL_TIMEOUT for the ranks, seconds
  const std::string token = fmt::format("shoalstop{}", ::getpid());
  Watched job({SHOAL_BIN, "run", "-n", "3", "--timeout", std::to_string(kTimeout), "--",
               SHOAL_TEST_WORKER, "loop", "allreduce_ring", token});
  auto allReady = [](const std::string& out) {
    return out.find("[0] ready") != std::string::npos &&
           out.find("[1] ready") != std::string::npos && out.find("[2] ready") != std::string::npos;
  };
  ASSERT_TRUE(job.readUntil(allReady, Deadline(60s))) << "ranks never became ready\n"
                                                      << job.output();
  const pid_t victim = rankPid(job.pid(), 2);
  ASSERT_GT(victim, 0) << "no child of the launcher has SHOAL_RANK=2\n" << job.output();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const auto stoppedAt = std::chrono::steady_clock::now();

  // Survivors time out after kTimeout; the launcher then stops everything (the stopped rank
  // too) and exits. The bound is generous: only a hang or a far overrun fails it.
  const Deadline deadline(std::chrono::seconds(kTimeout + 30));
  job.readUntil([](const std::string&) { return false; }, deadline);  // to the end of output
  const int code = job.wait(deadline);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stoppedAt).count();
  const std::string out = job.output();
  ASSERT_NE(code, -1) << "the launcher did not exit within " << kTimeout + 30 << " s\n" << out;
  EXPECT_EQ(code, 128 + SIGSTOP) << out;
  EXPECT_LT(took, kTimeout + 30) << out;
  EXPECT_NE(out.find(fmt::format("rank 2 (localhost, pid {}) was stopped (SIGSTOP)", victim)),
            std::string::npos)
      << "the launcher did not report the stop\n"
      << out;
  EXPECT_NE(out.find(fmt::format("job failed: rank 2 (host localhost, pid {}) was stopped "
                                 "(SIGSTOP) and never continued",
                                 victim)),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("job failed: rank 0"), std::string::npos) << out;
  EXPECT_EQ(out.find("job failed: rank 1"), std::string::npos) << out;
  // The survivors did time out (that is what the summary explains), and nothing is left.
  EXPECT_NE(out.find("ERROR TimeoutError"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(fmt::format("/proc/{}", victim)))
      << "the stopped rank outlived the launcher\n"
      << out;
}

TEST(Spawner, OnlyTheStandardStreamsAreInherited) {
  // A descriptor opened without O_CLOEXEC, as a careless library would.
  Fd leaky(::open("/dev/null", O_RDONLY));
  ASSERT_TRUE(leaky.valid());
  Watched child({"/bin/sh", "-c", "ls /proc/self/fd"});
  ASSERT_TRUE(child.readUntil([](const std::string&) { return false; }, Deadline(30s)));
  EXPECT_EQ(child.wait(Deadline(30s)), 0) << child.output();
  // ls lists 0, 1, 2 and the descriptor it reads the directory through.
  std::vector<std::string> fds;
  for (size_t at = 0, nl; (nl = child.output().find('\n', at)) != std::string::npos; at = nl + 1) {
    fds.push_back(child.output().substr(at, nl - at));
  }
  // Had fd `leaky` (or any other non-close-on-exec descriptor of this test) leaked, there would
  // be more.
  EXPECT_EQ(fds.size(), 4u) << "leaked descriptors (this process has fd " << leaky.get()
                            << " open without O_CLOEXEC):\n"
                            << child.output();
}

TEST(Spawner, EachProcessLeadsItsOwnGroup) {
  // Field 5 of /proc/<pid>/stat is the process group.
  Watched child({"/bin/sh", "-c", "set -- $(cat /proc/$$/stat); echo $5"});
  ASSERT_TRUE(child.readUntil([](const std::string&) { return false; }, Deadline(30s)));
  EXPECT_EQ(child.wait(Deadline(30s)), 0) << child.output();
  EXPECT_EQ(std::stoi(child.output()), child.pid()) << child.output();
}

TEST(Spawner, AFailedExecIsAnErrorNotAnExitCode) {
  TempDir dir;
  const std::string notExecutable = dir.path + "/script";
  { std::ofstream(notExecutable) << "not a program\n"; }
  std::filesystem::permissions(notExecutable, std::filesystem::perms::owner_all);
  run::SpawnOptions o;
  o.argv = {notExecutable};
  EXPECT_THROW(run::spawn(o), SystemError);  // exec: Exec format error
  o.argv = {"shoal-no-such-program"};
  EXPECT_THROW(run::spawn(o), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
