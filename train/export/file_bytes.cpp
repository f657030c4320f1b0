// train/export/file_bytes.h.
#include "train/export/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/error.h"

namespace shoal::train {

std::string readFileBytes(const std::string& path, uint64_t maxBytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) SHOAL_THROW(InvalidArgument, "{}: no such file", path);
    throwSystemError("opening " + path, errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "{}: not a regular file", path);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > maxBytes) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "{}: {} bytes, more than the {} bytes a model file may hold", path,
                size, maxBytes);
  }
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      // A file that shrank while being read (rewritten in place) is as bad as a short one.
      if (n == 0) SHOAL_THROW(InvalidArgument, "{}: shorter than its size while read", path);
      throwSystemError("reading " + path, err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

void writeFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throwSystemError("creating " + tmp, errno);
  size_t done = 0;
  int err = 0;
  while (done < bytes.size() && err == 0) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      err = errno;
    else
      done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    std::remove(tmp.c_str());
    throwSystemError("writing " + path, err);
  }
}

}  // namespace shoal::train
