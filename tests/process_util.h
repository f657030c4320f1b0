// Small helpers shared by the multi-process tests.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"

namespace shoal::test {

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/shoal-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// What /dev/shm holds now: a test compares before and after to catch a leaked segment. Shoal's
// segments are memfds and never appear there, so anything new would be a leak; the files other
// programs make there while tests run beside each other (Python's multiprocessing semaphores,
// PyTorch's and OpenMPI's shared memory, scripts/fuzz.sh's scratch folder) are left out, or they
// would fail the comparison.
inline std::set<std::string> shmEntries() {
  static const char* const kForeign[] = {"sem.", "torch_",   "vader_segment", "psm_",
                                         "ompi", "open_mpi", "shoal-fuzz."};
  std::set<std::string> out;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    bool foreign = false;
    for (const char* prefix : kForeign) foreign = foreign || name.rfind(prefix, 0) == 0;
    if (!foreign) out.insert(e.path().string());
  }
  return out;
}

// A shell command's exit code (128 + signal if killed) and its output, stdout and stderr
// together.
struct ShellRun {
  int code;
  std::string output;
};
inline ShellRun runShell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {127, "popen failed"};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The Shoal error type's name, for rank programs that print "ERROR <Type>: <message>".
inline const char* typeName(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const PeerError*>(&e)) return "PeerError";
  if (dynamic_cast<const MismatchError*>(&e)) return "MismatchError";
  if (dynamic_cast<const ProtocolError*>(&e)) return "ProtocolError";
  if (dynamic_cast<const StoreError*>(&e)) return "StoreError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  return "Error";
}

// A process with its stdout+stderr in a file; killed if still running at scope exit.
//
// Waiting never sleeps: wait() blocks in poll(2) on a pidfd (readable when the process ends),
// waitForOutput() on inotify events of the output file; both up to a deadline.
class Proc {
 public:
  using Env = std::vector<std::pair<std::string, std::string>>;

  Proc(const std::vector<std::string>& argv, const std::string& outFile, const Env& env = {})
      : out_(outFile) {
    // Created before the child starts, so that waitForOutput() never races the first write.
    ::close(::open(outFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(outFile.c_str(), O_WRONLY | O_APPEND);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(127);
    }
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd_ < 0) throwSystemError("pidfd_open", errno);
  }
  ~Proc() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(pidfd_);
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  // The exit code (128 + signal if killed); -1 if it did not end in time (then killed).
  int wait(std::chrono::milliseconds timeout) {
    if (done_) return code_;
    pollfd p{pidfd_, POLLIN, 0};
    int ready = 0;
    do {
      ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      done_ = true;
      return code_ = -1;
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    done_ = true;
    return code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }
  bool running() const {
    pollfd p{pidfd_, POLLIN, 0};
    return !done_ && ::poll(&p, 1, 0) == 0;
  }
  std::string output() const { return readFile(out_); }

  // Blocks until done(output()) holds (true), the process ends without it (false), or the
  // timeout passes (false).
  bool waitForOutput(const std::function<bool(const std::string&)>& done,
                     std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (in < 0) throwSystemError("inotify_init1", errno);
    ::inotify_add_watch(in, out_.c_str(), IN_MODIFY);
    bool ok = false;
    for (;;) {
      // Checked after the watch exists: a write between the check and poll() still wakes it.
      if (done(output())) {
        ok = true;
        break;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !running()) break;
      pollfd p[2] = {{in, POLLIN, 0}, {pidfd_, POLLIN, 0}};
      if (::poll(p, 2, static_cast<int>(left.count())) > 0 && (p[0].revents & POLLIN)) {
        char events[4096];
        while (::read(in, events, sizeof(events)) > 0) {
        }
      }
    }
    ::close(in);
    // One last look: the process may have written its line and ended at once.
    return ok || done(output());
  }
  bool waitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
    return waitForOutput(
        [&](const std::string& out) { return out.find(text) != std::string::npos; }, timeout);
  }

 private:
  std::string out_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool done_ = false;
  int code_ = -1;
};

struct RunResult {
  int code;
  std::string output;
  double seconds;
};

// `<shoal> run <args>` with its output in <dir>/launcher.out, under a deadline.
inline RunResult shoalRun(const std::string& shoal, const std::vector<std::string>& args,
                          const TempDir& dir,
                          std::chrono::seconds timeout = std::chrono::seconds(120)) {
  std::vector<std::string> argv{shoal, "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto t0 = std::chrono::steady_clock::now();
  Proc p(argv, dir.path + "/launcher.out");
  int code = p.wait(std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  return {code, p.output(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace shoal::test
