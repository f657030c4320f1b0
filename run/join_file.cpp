#include "run/join_file.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/error.h"

namespace shoal::run {

namespace {

constexpr std::string_view kHeader = "# shoal join file 1";
constexpr off_t kMaxBytes = 64 << 10;
constexpr const char* kRequired[] = {"SHOAL_STORE_ADDR", "SHOAL_SECRET", "SHOAL_ELASTIC",
                                     "SHOAL_WORLD_SIZE"};

bool validName(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

bool validValue(std::string_view value) {
  return value.find_first_of(std::string_view("\n\r\0", 3)) == std::string_view::npos;
}

}  // namespace

void writeJoinFile(const std::string& path, const Variables& vars) {
  std::string text = std::string(kHeader) + "\n";
  for (const auto& [name, value] : vars) {
    if (!validName(name) || !validValue(value)) {
      SHOAL_THROW(InvalidArgument, "join file {}: cannot hold the variable '{}'", path, name);
    }
    text += name + "=" + value + "\n";
  }
  // Owner-only from its creation: the secret is never readable by others, not even briefly.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throwSystemError("join file " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      throwSystemError("join file " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  // fchmod too: O_CREAT keeps the mode of a leftover temporary of the same name.
  if (::fchmod(fd, 0600) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throwSystemError("join file " + path, err);
  }
}

Variables readJoinFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    SHOAL_THROW(InvalidArgument,
                "join file {}: {} (is the job running? shoal run --join-file "
                "writes it and removes it when the job ends)",
                path, std::strerror(errno));
  }
  struct stat st {};
  std::string text;
  const bool ok = ::fstat(fd, &st) == 0;
  if (ok && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0 && st.st_size <= kMaxBytes) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (!ok || !S_ISREG(st.st_mode)) SHOAL_THROW(InvalidArgument, "join file {}: not a file", path);
  if ((st.st_mode & 077) != 0) {
    SHOAL_THROW(InvalidArgument,
                "join file {}: readable by others (mode {:o}): it holds the job's secret; "
                "chmod 600 it",
                path, st.st_mode & 0777);
  }
  if (st.st_size > kMaxBytes) {
    SHOAL_THROW(InvalidArgument, "join file {}: {} bytes, more than a join file's {}", path,
                st.st_size, kMaxBytes);
  }
  Variables vars;
  size_t at = 0;
  int line = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const std::string_view l =
        std::string_view(text).substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    ++line;
    if (line == 1) {
      if (l != kHeader) {
        SHOAL_THROW(InvalidArgument, "join file {}: not a Shoal join file (first line '{:.40}')",
                    path, l);
      }
      continue;
    }
    const size_t eq = l.find('=');
    if (eq == std::string_view::npos || !validName(l.substr(0, eq)) ||
        !validValue(l.substr(eq + 1))) {
      SHOAL_THROW(InvalidArgument, "join file {}: line {} is not NAME=VALUE", path, line);
    }
    vars.emplace_back(std::string(l.substr(0, eq)), std::string(l.substr(eq + 1)));
  }
  if (line == 0) SHOAL_THROW(InvalidArgument, "join file {}: empty", path);
  for (const char* name : kRequired) {
    bool found = false;
    for (const auto& kv : vars) found = found || kv.first == name;
    if (!found) SHOAL_THROW(InvalidArgument, "join file {}: no {}", path, name);
  }
  return vars;
}

Variables joinerVariables(const Variables& file) {
  Variables v = file;
  std::string size;
  for (const auto& [name, value] : file) {
    if (name == "SHOAL_WORLD_SIZE") size = value;
  }
  v.insert(v.end(), {{"SHOAL_RANK", size},
                     {"SHOAL_LOCAL_RANK", "0"},
                     {"SHOAL_LOCAL_WORLD_SIZE", "1"},
                     {"SHOAL_ROLE", "worker"},
                     {"SHOAL_ELASTIC_MEMBER", "auto"}});
  return v;
}

void execJoiner(const std::string& path, const std::vector<std::string>& command) {
  if (command.empty()) {
    SHOAL_THROW(InvalidArgument, "no program given (shoal join FILE -- prog args)");
  }
  for (const auto& [name, value] : joinerVariables(readJoinFile(path))) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  SHOAL_THROW(InvalidArgument, "{}: cannot be started: {}", command[0], std::strerror(errno));
}

}  // namespace shoal::run
