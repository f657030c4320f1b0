#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"

namespace shoal::transport::shm {

namespace {
void* mapShared(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throwSystemError("mmap of a shared segment", errno);
  return p;
}
}  // namespace

std::shared_ptr<Segment> Segment::create(size_t bytes, const std::string& name) {
  Fd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd.valid()) throwSystemError("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) < 0) {
    throwSystemError("ftruncate of a shared segment", errno);
  }
  void* p = mapShared(fd.get(), bytes);
  return std::shared_ptr<Segment>(new Segment(std::move(fd), p, bytes));
}

std::shared_ptr<Segment> Segment::open(pid_t pid, int fd, size_t bytes) {
  std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  Fd f(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!f.valid()) {
    int err = errno;
    SHOAL_THROW(PeerError, "cannot open shared segment {} of process {}: {}", path, pid,
                std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.get(), &st) < 0) throwSystemError("fstat " + path, errno);
  if (static_cast<size_t>(st.st_size) < bytes) {
    SHOAL_THROW(ProtocolError, "shared segment {} has {} bytes, expected {}", path, st.st_size,
                bytes);
  }
  void* p = mapShared(f.get(), bytes);
  // The mapping keeps the memory alive; the descriptor is not needed.
  return std::shared_ptr<Segment>(new Segment(Fd(), p, bytes));
}

Segment::~Segment() {
  ::munmap(data_, size_);
}

std::string hostIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  return std::string(host) + "/" + boot;
}

}  // namespace shoal::transport::shm
