// The one way Shoal starts a local process: `shoal run`'s local ranks and its ssh clients, and
// LocalJob's ranks (tests, benchmarks). What every spawned process gets:
// - its own process group (pgid == pid), so kill(-pid, sig) also reaches whatever it starts;
// - PR_SET_PDEATHSIG = SIGKILL: it is killed when the spawning *thread* ends (Linux ties the
//   parent-death signal to the thread that forked), so a crashed launcher or test leaves no
//   rank behind. Spawn from a thread that outlives the child (the main thread, typically);
// - stdin from /dev/null or a pipe; stdout and stderr inherited, /dev/null, a pipe each, or one
//   file for both (lines of the two streams interleave in the order they were written);
// - no other descriptor of the parent: every fd above 2 is closed at exec, including those
//   other threads or libraries opened without O_CLOEXEC;
// - SIGPIPE back to its default action (launchers ignore it; a rank's `| head` must work) and
//   the given signal mask (default: nothing blocked).
//
// Threading: spawn() may be called from several threads at once. Between fork and exec the
// child uses only async-signal-safe calls, so spawning from a multi-threaded process (the store
// runs a thread) is safe.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/socket.h"

namespace shoal::run {

enum class StreamMode {
  kInherit,  // the spawner's own stream
  kNull,     // /dev/null
  kPipe,     // a pipe, the parent's end in SpawnedProcess
  kFile,     // SpawnOptions::outputFile (stdout and stderr)
};

struct SpawnOptions {
  // argv[0] is the program: a path (used as given), or a bare name looked up on this process's
  // PATH before anything starts.
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the child's whole environment, "NAME=value" entries
  bool stdinPipe = false;        // false: stdin is /dev/null
  StreamMode out = StreamMode::kInherit;
  StreamMode err = StreamMode::kInherit;
  std::string outputFile;              // with kFile: created (0644) or truncated
  std::optional<sigset_t> signalMask;  // the child's mask; unset: nothing blocked
};

struct SpawnedProcess {
  pid_t pid = -1;  // also its process group id; the caller reaps it (waitpid)
  Fd in;           // write end of its stdin (stdinPipe)
  Fd out, err;     // read ends of its stdout / stderr (kPipe)
};

// Starts the process and returns once it has exec'd its program. Blocking only for as long as
// the child takes to reach exec (a few system calls). Throws InvalidArgument when the program is
// not found or not executable, SystemError when a pipe, the output file or fork fails, or when
// exec fails (with the reason; the failed child is reaped). The returned descriptors are
// close-on-exec in the parent, so later spawns do not inherit them.
SpawnedProcess spawn(const SpawnOptions& options);

// A pidfd for `pid` (a child not yet reaped): poll(2) reports it readable once the process has
// exited, so a wait can block with a deadline instead of sleeping between waitpid(WNOHANG)
// calls. Throws SystemError.
Fd openPidFd(pid_t pid);

}  // namespace shoal::run
