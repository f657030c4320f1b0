// A Link between two processes (or threads) on one host through a pair segment holding two
// rings, one per direction. Every write rings the reader's doorbell, and a read rings the
// writer's when the writer waits for space (Note [Waiting for space] in ring.h), so either side
// can sleep (see doorbell.h). The pair's TCP socket stays open beside
// it: abort frames travel there, and its end-of-file is how a dead peer is noticed.
#pragma once

#include <memory>

#include "common/socket.h"
#include "transport/link.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"

namespace shoal::transport::shm {

class ShmLink : public Link {
 public:
  // `segment` holds two rings of `capacity` each: the lower rank writes the first, the higher
  // rank the second. `peerBell` is the peer's doorbell (in `peerBellSegment`).
  ShmLink(LinkContext ctx, Fd socket, std::shared_ptr<Segment> segment, size_t capacity,
          std::shared_ptr<Segment> peerBellSegment);

  LinkKind kind() const override { return LinkKind::kShm; }
  size_t writeSome(const iovec* iov, int iovcnt) override;
  size_t readSome(void* dst, size_t n) override;
  std::pair<const uint8_t*, size_t> peek() override;
  void consume(size_t n) override;
  const std::atomic<uint64_t>* arrivalWatch() const override { return in_.emptyWatch(); }
  int socketFd() const override { return socket_.get(); }
  void shutdown() override;

  // Bytes a pair segment needs for rings of `capacity`.
  static size_t segmentBytes(size_t capacity) { return 2 * ringBytes(capacity); }

 private:
  Fd socket_;
  std::shared_ptr<Segment> segment_;
  std::shared_ptr<Segment> peerBellSegment_;
  DoorbellWord* peerBell_;
  RingWriter out_;
  RingReader in_;
};

// Largest piece copied per write: the reader starts reducing a piece while the writer copies
// the next, and pieces stay cache-sized.
inline constexpr size_t kShmSliceBytes = 256 << 10;

}  // namespace shoal::transport::shm
