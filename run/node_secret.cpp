#include "run/node_secret.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "common/error.h"
#include "transport/auth.h"

namespace shoal::run {

namespace {

constexpr size_t kSecretSize = 64;  // transport::generateSecret(): 32 bytes as hex

// Closes a descriptor when it goes.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool isPrivate(const struct stat& st) {
  return st.st_uid == ::geteuid() && (st.st_mode & 077) == 0;
}

std::string defaultBase() {
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && *runtime) {
    return std::string(runtime) + "/shoal";
  }
  return "/tmp/shoal-" + std::to_string(::geteuid());
}

std::string pathOf(const std::string& dir, const std::string& key) {
  return dir + "/" + key + ".secret";
}

bool isHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The secret at `path` if a file that passes the header's checks is there; nullopt if there is
// none yet or it does not pass (a reader waits for one that does).
std::optional<std::string> readIfValid(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) || !isPrivate(st) ||
      st.st_size != static_cast<off_t>(kSecretSize)) {
    return std::nullopt;
  }
  std::string secret(kSecretSize, '\0');
  size_t done = 0;
  while (done < kSecretSize) {
    const ssize_t n = ::read(f.fd, secret.data() + done, kSecretSize - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    done += static_cast<size_t>(n);
  }
  if (!isHex(secret)) return std::nullopt;
  return secret;
}

}  // namespace

std::string slurmSecretKey(const std::string& jobId, const std::string& stepId) {
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(jobId)) {
    SHOAL_THROW(InvalidArgument, "slurm: SLURM_JOB_ID '{}' is not a job id", jobId);
  }
  const std::string step = stepId.empty() ? "0" : stepId;
  if (!digits(step)) {
    SHOAL_THROW(InvalidArgument, "slurm: SLURM_STEP_ID '{}' is not a step id", stepId);
  }
  return "slurm-" + jobId + "." + step;
}

std::string nodeSecretDirectory(const std::string& base) {
  const std::string dir = base.empty() ? defaultBase() : base;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throwSystemError("node secret: cannot create the directory " + dir, errno);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throwSystemError("node secret: " + dir, errno);
  if (!S_ISDIR(st.st_mode) || !isPrivate(st)) {
    SHOAL_THROW(InvalidArgument,
                "node secret: {} must be a directory owned by this user with mode 0700 (found a "
                "{} owned by uid {} with mode {:o}); remove it or set SHOAL_SECRET",
                dir, S_ISDIR(st.st_mode) ? "directory" : "non-directory", st.st_uid,
                st.st_mode & 07777);
  }
  return dir;
}

NodeSecret publishNodeSecret(const std::string& key, const std::string& base) {
  const std::string dir = nodeSecretDirectory(base);
  const std::string path = pathOf(dir, key);
  const std::string temp = path + ".new." + std::to_string(::getpid());
  NodeSecret out{transport::generateSecret(), nullptr};
  {
    ::unlink(temp.c_str());  // a leftover of a process that had this pid: never ours to keep
    Fd f(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (f.fd < 0) throwSystemError("node secret: cannot create " + temp, errno);
    size_t done = 0;
    while (done < out.secret.size()) {
      const ssize_t n = ::write(f.fd, out.secret.data() + done, out.secret.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        throwSystemError("node secret: cannot write " + temp, err);
      }
      done += static_cast<size_t>(n);
    }
  }
  // Readers see the whole file or none: the rename is atomic, and it is the event they wait on.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throwSystemError("node secret: cannot publish " + path, err);
  }
  out.file = std::shared_ptr<void>(nullptr, [path](void*) { ::unlink(path.c_str()); });
  return out;
}

std::string awaitNodeSecret(const std::string& key, int rank, Duration timeout,
                            const std::string& base) {
  const Deadline deadline(timeout);
  const std::string dir = nodeSecretDirectory(base);
  const std::string path = pathOf(dir, key);
  Fd watch(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (watch.fd < 0) throwSystemError("node secret: inotify", errno);
  // Watched before the first look, so a file published in between is not missed.
  if (::inotify_add_watch(watch.fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB) < 0) {
    throwSystemError("node secret: cannot watch " + dir, errno);
  }
  for (;;) {
    if (auto secret = readIfValid(path)) return *secret;
    if (deadline.expired()) {
      SHOAL_THROW(TimeoutError,
                  "rank {}: no job secret at {} after {:.1f} s: the rank hosting the store "
                  "(rank 0, on this node) publishes it there when started without SHOAL_SECRET; "
                  "is it running?",
                  rank, path, deadline.timeoutSeconds());
    }
    pollfd p{watch.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, deadline.remainingMs());
    if (r < 0 && errno != EINTR) throwSystemError("node secret: poll", errno);
    // Drain the events: which file changed does not matter, the next look reads the one that
    // counts.
    alignas(inotify_event) char events[4096];
    while (::read(watch.fd, events, sizeof(events)) > 0) {
    }
  }
}

}  // namespace shoal::run
