// Small helpers shared by the multi-process tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
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

// What /dev/shm holds now: a test compares before and after to catch a leaked segment.
inline std::set<std::string> shmEntries() {
  std::set<std::string> out;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm")) out.insert(e.path().string());
  return out;
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
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::string& outFile) : out_(outFile) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(outFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(127);
    }
  }
  ~Proc() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal if killed); -1 if it did not end in time (then killed).
  int wait(std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        done_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    done_ = true;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }
  std::string output() const { return readFile(out_); }

 private:
  std::string out_;
  pid_t pid_ = -1;
  bool done_ = false;
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
  int code = p.wait(timeout);
  return {code, p.output(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace shoal::test
