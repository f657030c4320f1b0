// Shared-memory segments backed by memfd: anonymous files that never appear in /dev/shm and
// vanish when the last process holding them exits, crash included. A peer on the same host maps
// one through /proc/<pid>/fd/<fd> of its creator (same user only), so nothing can leak.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "common/socket.h"

namespace shoal::transport::shm {

class Segment {
 public:
  // Creates and maps a zero-filled segment of `bytes`.
  static std::shared_ptr<Segment> create(size_t bytes, const std::string& name);
  // Maps the creator's segment. Throws ProtocolError if it is smaller than `bytes`, and
  // PeerError if it cannot be opened (creator gone, another user).
  static std::shared_ptr<Segment> open(pid_t pid, int fd, size_t bytes);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Valid for created segments: what a peer needs to open it.
  int fd() const { return fd_.get(); }

 private:
  Segment(Fd fd, void* data, size_t size) : fd_(std::move(fd)), data_(data), size_(size) {}
  Fd fd_;
  void* data_;
  size_t size_;
};

// Whether two ranks share a machine: same hostname and the same kernel boot id.
std::string hostIdentity();

}  // namespace shoal::transport::shm
