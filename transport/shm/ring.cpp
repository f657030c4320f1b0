#include "transport/shm/ring.h"

#include <algorithm>
#include <cstring>

namespace shoal::transport::shm {

RingWriter::RingWriter(void* base, size_t capacity)
    : ctl_(static_cast<RingControl*>(base)),
      data_(static_cast<uint8_t*>(base) + kRingControlBytes),
      cap_(capacity),
      head_(ctl_->head.load(std::memory_order_relaxed)),
      tailCache_(ctl_->tail.load(std::memory_order_acquire)) {}

size_t RingWriter::write(const iovec* iov, int iovcnt, size_t maxBytes) {
  size_t want = 0;
  for (int i = 0; i < iovcnt && want < maxBytes; ++i) want += iov[i].iov_len;
  want = std::min(want, maxBytes);
  uint64_t space = cap_ - (head_ - tailCache_);
  if (space < want) {
    tailCache_ = ctl_->tail.load(std::memory_order_acquire);
    space = cap_ - (head_ - tailCache_);
  }
  if (space == 0 && want > 0) {
    // Note [Waiting for space]: nothing fits, so the caller will wait: announce it, then look
    // once more. (Not when some of it fits: the caller comes back for the rest before it waits,
    // and the flag's line is the reader's.)
    ctl_->writerWaiting.store(1, std::memory_order_seq_cst);
    tailCache_ = ctl_->tail.load(std::memory_order_seq_cst);
    space = cap_ - (head_ - tailCache_);
  }
  size_t budget = static_cast<size_t>(std::min<uint64_t>(space, maxBytes));
  size_t written = 0;
  for (int i = 0; i < iovcnt && budget > 0; ++i) {
    auto* src = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t n = std::min(iov[i].iov_len, budget);
    while (n > 0) {
      size_t at = static_cast<size_t>(head_ % cap_);
      size_t piece = std::min<size_t>(n, cap_ - at);
      std::memcpy(data_ + at, src, piece);
      src += piece;
      n -= piece;
      head_ += piece;
      budget -= piece;
      written += piece;
    }
  }
  if (written > 0) ctl_->head.store(head_, std::memory_order_release);
  return written;
}

RingReader::RingReader(void* base, size_t capacity)
    : ctl_(static_cast<RingControl*>(base)),
      data_(static_cast<uint8_t*>(base) + kRingControlBytes),
      cap_(capacity),
      tail_(ctl_->tail.load(std::memory_order_relaxed)),
      headCache_(ctl_->head.load(std::memory_order_acquire)) {}

std::pair<const uint8_t*, size_t> RingReader::peek() {
  if (headCache_ == tail_) headCache_ = ctl_->head.load(std::memory_order_acquire);
  uint64_t avail = headCache_ - tail_;
  size_t at = static_cast<size_t>(tail_ % cap_);
  return {data_ + at, static_cast<size_t>(std::min<uint64_t>(avail, cap_ - at))};
}

bool RingReader::release() {
  // Note [Waiting for space]: tail first, then the flag, both sequentially consistent.
  ctl_->tail.store(tail_, std::memory_order_seq_cst);
  return ctl_->writerWaiting.load(std::memory_order_seq_cst) != 0 &&
         ctl_->writerWaiting.exchange(0, std::memory_order_seq_cst) != 0;
}

bool RingReader::consume(size_t n) {
  tail_ += n;
  return release();
}

size_t RingReader::read(void* dst, size_t n, bool& wakeWriter) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t total = 0;
  // At most two contiguous pieces (before and after the wrap).
  for (int i = 0; i < 2 && total < n; ++i) {
    auto [p, avail] = peek();
    size_t piece = std::min(avail, n - total);
    if (piece == 0) break;
    std::memcpy(out + total, p, piece);
    tail_ += piece;
    total += piece;
  }
  wakeWriter = total > 0 && release();
  return total;
}

}  // namespace shoal::transport::shm
