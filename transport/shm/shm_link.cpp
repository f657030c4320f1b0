#include "transport/shm/shm_link.h"

#include <sys/socket.h>

#include "common/error.h"

namespace shoal::transport::shm {

namespace {
// The ring names a position; the link adds who reads from whom.
[[noreturn]] void outOfStep(const LinkContext& ctx, const ProtocolError& e) {
  SHOAL_THROW(ProtocolError, "rank {} ← peer {}: {}", ctx.rank, ctx.peer, e.what());
}
}  // namespace

ShmLink::ShmLink(LinkContext ctx, Fd socket, std::shared_ptr<Segment> segment, size_t capacity,
                 std::shared_ptr<Segment> peerBellSegment)
    : Link(ctx),
      socket_(std::move(socket)),
      segment_(std::move(segment)),
      peerBellSegment_(std::move(peerBellSegment)),
      peerBell_(static_cast<DoorbellWord*>(peerBellSegment_->data())) {
  auto* base = static_cast<uint8_t*>(segment_->data());
  uint8_t* lowToHigh = base;
  uint8_t* highToLow = base + ringBytes(capacity);
  bool lower = ctx.rank < ctx.peer;
  out_ = RingWriter(lower ? lowToHigh : highToLow, capacity);
  in_ = RingReader(lower ? highToLow : lowToHigh, capacity);
}

size_t ShmLink::writeSome(const iovec* iov, int iovcnt) {
  size_t n = out_.write(iov, iovcnt, kShmSliceBytes);
  if (n > 0) ring(peerBell_);
  return n;
}

size_t ShmLink::readSome(void* dst, size_t n) {
  bool wakeWriter = false;
  size_t r = 0;
  try {
    r = in_.read(dst, n, wakeWriter);
  } catch (const ProtocolError& e) {
    outOfStep(ctx_, e);
  }
  if (wakeWriter) ring(peerBell_);
  return r;
}

std::pair<const uint8_t*, size_t> ShmLink::peek() {
  try {
    return in_.peek();
  } catch (const ProtocolError& e) {
    outOfStep(ctx_, e);
  }
}

void ShmLink::consume(size_t n) {
  if (in_.consume(n)) ring(peerBell_);
}

void ShmLink::shutdown() {
  if (socket_.valid()) ::shutdown(socket_.get(), SHUT_RDWR);
  ring(peerBell_);  // so a sleeping peer wakes up and finds the closed socket
}

}  // namespace shoal::transport::shm
