#include "transport/shm/ring.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.h"

namespace shoal::transport::shm {

namespace {

// Note [Records]: how far ahead the writer zeroes stamps, and after which records. After a
// larger one, a stretch made the next record's lines bounce between the cores (a 4 KiB
// ping-pong: 0.33 us one way zeroing one line, 0.40 zeroing 1 KiB).
constexpr uint64_t kZeroAhead = 1024;
constexpr uint64_t kZeroAheadAfter = 4 * kRingLine;

uint64_t roundUpToLine(uint64_t position) {
  return (position + kRingLine - 1) / kRingLine * kRingLine;
}

// A stamp: the record's length in the low half, its line number + 1 in the high half.
uint64_t stampOf(uint64_t position, uint64_t length) {
  const uint32_t line = static_cast<uint32_t>(position / kRingLine + 1);
  return uint64_t{line} << 32 | length;
}

std::atomic<uint64_t>* stampWord(uint8_t* data, uint64_t cap, uint64_t position) {
  // Lines are 64-byte aligned in the segment, so the word is 8-byte aligned.
  return reinterpret_cast<std::atomic<uint64_t>*>(data + position % cap);
}

}  // namespace

LocalRingMemory::LocalRingMemory(size_t capacity)
    : base_(static_cast<uint8_t*>(std::aligned_alloc(kRingLine, ringBytes(capacity)))) {
  if (base_ == nullptr) throw std::bad_alloc();
  std::memset(base_, 0, ringBytes(capacity));
}

LocalRingMemory::~LocalRingMemory() {
  std::free(base_);
}

// Copies bytes [skip, skip + n) of the iovecs' stream to the ring from byte `at` on.
void RingWriter::copyIn(const iovec* iov, int iovcnt, size_t skip, size_t n, uint64_t at) {
  for (int i = 0; i < iovcnt && n > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    auto* src = static_cast<const uint8_t*>(iov[i].iov_base) + skip;
    size_t take = std::min(iov[i].iov_len - skip, n);
    skip = 0;
    n -= take;
    while (take > 0) {
      const size_t offset = static_cast<size_t>(at % cap_);
      const size_t piece = std::min<size_t>(take, cap_ - offset);
      std::memcpy(data_ + offset, src, piece);
      src += piece;
      take -= piece;
      at += piece;
    }
  }
}

RingWriter::RingWriter(void* base, size_t capacity)
    : ctl_(static_cast<RingControl*>(base)),
      data_(static_cast<uint8_t*>(base) + kRingControlBytes),
      cap_(ringCapacity(capacity)),
      tailCache_(ctl_->tail.load(std::memory_order_acquire)) {}

// The most of `want` one record can take now: its line-rounded size, plus the next record's
// stamp (Note [Records]), must fit in the space the reader released.
size_t RingWriter::fits(size_t want) const {
  const uint64_t space = cap_ - (head_ - tailCache_);
  if (space < kStampBytes + kRingLine) return 0;
  const uint64_t record = (space - kStampBytes) / kRingLine * kRingLine;
  return static_cast<size_t>(std::min<uint64_t>(want, record - kStampBytes));
}

size_t RingWriter::write(const iovec* iov, int iovcnt, size_t maxBytes) {
  size_t want = 0;
  for (int i = 0; i < iovcnt && want < maxBytes; ++i) want += iov[i].iov_len;
  want = std::min(want, maxBytes);
  if (want == 0) return 0;
  size_t length = fits(want);
  if (length < want) {
    tailCache_ = ctl_->tail.load(std::memory_order_acquire);
    length = fits(want);
  }
  if (length == 0) {
    // Note [Waiting for space]: nothing fits, so the caller will wait: announce it, then look
    // once more. (Not when some of it fits: the caller comes back for the rest before it waits,
    // and the flag's line is the reader's.)
    ctl_->writerWaiting.store(1, std::memory_order_seq_cst);
    tailCache_ = ctl_->tail.load(std::memory_order_seq_cst);
    length = fits(want);
    if (length == 0) return 0;
  }
  // Note [Records]: the next record's stamp is zeroed before these bytes are copied (stores
  // become visible in order, so zeroing after them made the stamp below wait for a line
  // nobody was reading: 8 B one way 0.186 us, zeroing first 0.181), after a small record a
  // kZeroAhead stretch of lines at a time (8 B: 0.139 us against 0.152 one line at a time), as
  // far as the space the reader released.
  const uint64_t next = roundUpToLine(head_ + kStampBytes + length);
  if (next >= zeroedTo_) {
    const uint64_t lastFree = (tailCache_ + cap_ - kStampBytes) / kRingLine * kRingLine;
    const uint64_t ahead = next - head_ <= kZeroAheadAfter ? kZeroAhead : kRingLine;
    const uint64_t to = std::min(next + ahead, lastFree + kRingLine);
    for (uint64_t x = std::max(next, zeroedTo_); x < to; x += kRingLine) {
      stampWord(data_, cap_, x)->store(0, std::memory_order_relaxed);
    }
    zeroedTo_ = to;
  }
  // The stamp's line last (Note [Records]).
  const size_t first = std::min<size_t>(length, kRingLine - kStampBytes);
  copyIn(iov, iovcnt, first, length - first, head_ + kRingLine);
  copyIn(iov, iovcnt, 0, first, head_ + kStampBytes);
  stampWord(data_, cap_, head_)->store(stampOf(head_, length), std::memory_order_release);
  head_ = next;
  return length;
}

RingReader::RingReader(void* base, size_t capacity)
    : ctl_(static_cast<RingControl*>(base)),
      data_(static_cast<uint8_t*>(base) + kRingControlBytes),
      cap_(ringCapacity(capacity)),
      tail_(ctl_->tail.load(std::memory_order_relaxed)),
      recordEnd_(tail_),
      published_(tail_),
      publishEvery_(std::min<uint64_t>(cap_ / 4, kPublishBytes)) {}

std::atomic<uint64_t>* RingReader::stampAt(uint64_t position) const {
  return stampWord(data_, cap_, position);
}

// At the end of a record: takes the next one if its stamp is there.
bool RingReader::nextRecord() {
  const uint64_t at = roundUpToLine(recordEnd_);
  const uint64_t stamp = stampAt(at)->load(std::memory_order_acquire);
  if (stamp == 0) return false;
  const uint64_t length = stamp & 0xffffffffu;
  if (stamp != stampOf(at, length) || length == 0 || length > cap_ - kRingLine - kStampBytes) {
    SHOAL_THROW(ProtocolError,
                "shared-memory ring out of step: the record at byte {} has stamp {:#x} (a {} "
                "byte ring)",
                at, stamp, cap_);
  }
  tail_ = at + kStampBytes;
  recordEnd_ = tail_ + length;
  return true;
}

std::pair<const uint8_t*, size_t> RingReader::peek() {
  if (tail_ == recordEnd_ && !nextRecord()) return {data_, 0};
  const size_t offset = static_cast<size_t>(tail_ % cap_);
  return {data_ + offset,
          static_cast<size_t>(std::min<uint64_t>(recordEnd_ - tail_, cap_ - offset))};
}

// The tail is published only every publishEvery_ bytes (Note [Records]).
bool RingReader::consume(size_t n) {
  tail_ += n;
  if (tail_ - published_ < publishEvery_) return false;
  published_ = tail_;
  // Note [Waiting for space]: tail first, then the flag, both sequentially consistent.
  ctl_->tail.store(tail_, std::memory_order_seq_cst);
  return ctl_->writerWaiting.load(std::memory_order_seq_cst) != 0 &&
         ctl_->writerWaiting.exchange(0, std::memory_order_seq_cst) != 0;
}

size_t RingReader::read(void* dst, size_t n, bool& wakeWriter) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t total = 0;
  wakeWriter = false;
  while (total < n) {
    auto [p, avail] = peek();
    const size_t piece = std::min(avail, n - total);
    if (piece == 0) break;
    std::memcpy(out + total, p, piece);
    total += piece;
    wakeWriter |= consume(piece);
  }
  return total;
}

const std::atomic<uint64_t>* RingReader::emptyWatch() const {
  if (tail_ != recordEnd_) return nullptr;
  const std::atomic<uint64_t>* word = stampAt(roundUpToLine(recordEnd_));
  return word->load(std::memory_order_acquire) == 0 ? word : nullptr;
}

}  // namespace shoal::transport::shm
