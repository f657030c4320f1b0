// A single-producer single-consumer byte ring in shared memory.
//
// `head` counts bytes ever written (producer-owned), `tail` bytes ever read (consumer-owned);
// each on its own cache line. The producer publishes data with a release store of head after
// copying; the consumer releases space with a release store of tail after copying out. Each side
// caches the other's counter and re-reads it only when the cache says the ring is full/empty.
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
  // Copies a prefix of iov into the ring, at most maxBytes; returns bytes written.
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
  size_t read(void* dst, size_t n);
  // Contiguous readable bytes starting at the read position.
  std::pair<const uint8_t*, size_t> peek();
  void consume(size_t n);

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t tail_ = 0;
  uint64_t headCache_ = 0;
};

}  // namespace shoal::transport::shm
