// A single-producer single-consumer byte ring in shared memory.
//
// `head` counts bytes ever written (producer-owned), `tail` bytes ever read (consumer-owned);
// each on its own cache line. The producer publishes data with a release store of head after
// copying; the consumer releases space with a store of tail after copying out. Each side caches
// the other's counter and re-reads it only when the cache says the ring is full/empty.
//
// Note [Waiting for space]: the consumer tells the producer that space was freed (rings its
// doorbell) only when the producer said it waits for space: a producer that finds too little
// space (none at all: it is about to wait) sets `writerWaiting`, then reads tail again; a
// consumer stores tail, then takes `writerWaiting`. Both sequentially consistent (a Dekker pair,
// like the doorbell's): either the producer sees the new tail or the consumer sees the flag.
// Ringing after every read instead made the receiver of each message write the sender's
// doorbell line twice (after the header and after the payload), on its way to its reply: an
// 8 B ping-pong took 0.22 us one way with that, 0.18 us without (bench/results/p2p.md).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace shoal::transport::shm {

struct RingControl {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> writerWaiting;  // Note [Waiting for space]; beside tail, which it guards
};
inline constexpr size_t kRingControlBytes = 128;
static_assert(sizeof(RingControl) == kRingControlBytes);

// Bytes a ring of `capacity` occupies in a segment.
inline size_t ringBytes(size_t capacity) {
  return kRingControlBytes + capacity;
}

class RingWriter {
 public:
  RingWriter() = default;
  RingWriter(void* base, size_t capacity);
  // Copies a prefix of iov into the ring, at most maxBytes; returns bytes written. When nothing
  // fit (0), the reader rings this side's doorbell once it frees space (Note [Waiting for
  // space]).
  size_t write(const iovec* iov, int iovcnt, size_t maxBytes);

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t head_ = 0;
  uint64_t tailCache_ = 0;
};

class RingReader {
 public:
  RingReader() = default;
  RingReader(void* base, size_t capacity);
  // Copies up to n readable bytes out; returns the count. `wakeWriter` is set when the writer
  // waits for the space this freed: the caller rings its doorbell (Note [Waiting for space]).
  size_t read(void* dst, size_t n, bool& wakeWriter);
  // Contiguous readable bytes starting at the read position.
  std::pair<const uint8_t*, size_t> peek();
  // Releases n peeked bytes; returns whether the writer waits for that space (as read()).
  bool consume(size_t n);
  // The writer's count of bytes written, and the value it has while nothing is unread: a wait
  // for data can spin on it directly (transport::Link::arrivalWatch).
  const std::atomic<uint64_t>* headWord() const { return &ctl_->head; }
  uint64_t position() const { return tail_; }

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t tail_ = 0;
  uint64_t headCache_ = 0;
  bool release();
};

}  // namespace shoal::transport::shm
