#include "run/spawner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "run/process_util.h"

namespace shoal::run {

namespace {

// What the child reports through the error pipe when it cannot reach exec.
struct ChildFailure {
  int stage;  // index into kStages
  int err;
};
constexpr const char* kStages[] = {"set up its process group", "set its parent-death signal",
                                   "set up its standard streams", "exec"};

// A close-on-exec descriptor that is not 0, 1 or 2: the child dup2()s its streams onto 0-2 in
// order, which must not overwrite a descriptor it still has to copy (possible when the
// spawner's own stdio is closed and pipe2 hands out a low number).
Fd highFd(int fd, const char* what) {
  if (fd < 0) throwSystemError(what, errno);
  if (fd > 2) return Fd(fd);
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int err = errno;
  ::close(fd);
  if (moved < 0) throwSystemError(what, err);
  return Fd(moved);
}

struct Pipe {
  Fd read, write;
};
Pipe makePipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) < 0) throwSystemError("pipe", errno);
  Pipe out;
  out.read = highFd(p[0], "pipe");
  out.write = highFd(p[1], "pipe");
  return out;
}

// In the child: report and leave. Async-signal-safe.
[[noreturn]] void childFail(int errPipe, int stage) {
  ChildFailure f{stage, errno};
  [[maybe_unused]] ssize_t w = ::write(errPipe, &f, sizeof(f));
  ::_exit(127);
}

}  // namespace

SpawnedProcess spawn(const SpawnOptions& o) {
  SHOAL_CHECK(!o.argv.empty(), "spawn needs a program");
  std::string program = o.argv[0];
  if (program.find('/') == std::string::npos) {
    program = findProgram(program);
    if (program.empty()) {
      SHOAL_THROW(InvalidArgument, "program '{}' not found on PATH", o.argv[0]);
    }
  }
  if (::access(program.c_str(), X_OK) != 0) {
    SHOAL_THROW(InvalidArgument, "program '{}' not found or not executable", program);
  }

  // Everything the child needs is prepared here: after fork it may not allocate.
  std::vector<char*> argv, envp;
  argv.push_back(program.data());
  for (size_t i = 1; i < o.argv.size(); ++i) argv.push_back(const_cast<char*>(o.argv[i].c_str()));
  argv.push_back(nullptr);
  for (auto& e : o.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const bool fileOut = o.out == StreamMode::kFile || o.err == StreamMode::kFile;
  SHOAL_CHECK(!fileOut || !o.outputFile.empty(), "StreamMode::kFile needs an output file");
  Fd devNull = highFd(::open("/dev/null", O_RDWR | O_CLOEXEC), "open /dev/null");
  Fd file;
  if (fileOut) {
    file = highFd(::open(o.outputFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
                  ("open " + o.outputFile).c_str());
  }
  Pipe in, out, err;
  if (o.stdinPipe) in = makePipe();
  if (o.out == StreamMode::kPipe) out = makePipe();
  if (o.err == StreamMode::kPipe) err = makePipe();
  Pipe status = makePipe();  // closes at exec (EOF for the parent) or carries a ChildFailure

  auto target = [&](StreamMode m, const Pipe& p) {
    switch (m) {
      case StreamMode::kNull:
        return devNull.get();
      case StreamMode::kPipe:
        return p.write.get();
      case StreamMode::kFile:
        return file.get();
      case StreamMode::kInherit:
        break;
    }
    return -1;
  };
  const int fd0 = o.stdinPipe ? in.read.get() : devNull.get();
  const int fd1 = target(o.out, out), fd2 = target(o.err, err);

  sigset_t mask;
  if (o.signalMask) {
    mask = *o.signalMask;
  } else {
    sigemptyset(&mask);
  }
  struct rlimit lim {};
  const int maxFd = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                        ? static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20))
                        : 1 << 16;
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throwSystemError("fork", errno);
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    const int report = status.write.get();
    if (::setpgid(0, 0) < 0) childFail(report, 0);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) childFail(report, 1);
    // The parent may have died before the line above: then nobody would kill us later.
    if (::getppid() != parent) ::_exit(127);
    if (::dup2(fd0, 0) < 0) childFail(report, 2);
    if (fd1 >= 0 && ::dup2(fd1, 1) < 0) childFail(report, 2);
    if (fd2 >= 0 && ::dup2(fd2, 2) < 0) childFail(report, 2);
    // Whatever else is open (descriptors of other threads, of libraries, without O_CLOEXEC)
    // closes at exec; the status pipe stays open until then.
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
      for (int fd = 3; fd < maxFd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::sigaction(SIGXFSZ, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    childFail(report, 3);
  }
  // Also from here, so that a kill(-pid) right after spawn() returns can never miss; fails
  // harmlessly (EACCES) when the child has already exec'd.
  ::setpgid(pid, pid);
  status.write.reset();
  ChildFailure failure{};
  ssize_t got;
  do {
    got = ::read(status.read.get(), &failure, sizeof(failure));
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    ::waitpid(pid, nullptr, 0);
    SHOAL_THROW(SystemError, "cannot start '{}': {} failed: {}", program, kStages[failure.stage],
                std::strerror(failure.err));
  }
  SpawnedProcess p;
  p.pid = pid;
  p.in = std::move(in.write);
  p.out = std::move(out.read);
  p.err = std::move(err.read);
  return p;
}

Fd openPidFd(pid_t pid) {
  // Through syscall(2): glibc 2.36's <sys/pidfd.h> lacks extern "C", so its wrapper cannot be
  // linked from C++.
  Fd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!fd.valid()) throwSystemError(fmt::format("pidfd_open {}", pid), errno);
  return fd;
}

}  // namespace shoal::run
