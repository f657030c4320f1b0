// A single-producer single-consumer ring of records in shared memory, read as a byte stream.
//
// Note [Records]: every write() becomes one record that starts on a 64-byte line: an 8-byte
// stamp, then the bytes (wrapping at the ring's end if need be), then padding to the next line.
// The stamp (the record's length and its line number) is stored last, with release order, so
// the reader learns of new bytes from the line that holds them: a small message (48-byte frame
// header and up to 8 bytes of payload) is one line. Before, the reader polled a separate head
// counter and then fetched the data's line, two cross-core misses in series.
//
// The writer copies the record's first line last, just before the stamp: the reader polls
// that line, and a store to it while the rest is copied would take the line away from the
// reader only to take it back for the stamp.
//
// A line holds bytes of earlier laps until the writer reaches it, so the writer zeroes the
// stamp of the line after a record before it publishes the record (after a small record, a
// stretch of free lines ahead at once): a reader that finished a record looks at a stamp that
// is either zero or a new record's. Each stamp also carries its line number, checked, so a ring out
// of step is a ProtocolError rather than bytes read as data. The writer keeps that next stamp's
// line free.
//
// `tail` counts bytes the consumer released (its own cache line, read by the producer only
// when the ring looks full). The consumer publishes it once kPublishBytes (at most a quarter of
// the ring) were consumed since it last did, not per record: a sequentially consistent store
// per message cost about 2% of an 8 B ping-pong. It never blocks the producer: what the
// consumer holds back is under a quarter of the ring, so a producer finds no room (and waits)
// only when the bytes not yet consumed fill the rest, and consuming them publishes.
//
// Note [Waiting for space]: the consumer tells the producer that space was freed (rings its
// doorbell) only when the producer said it waits for space: a producer that finds too little
// space (none at all: it is about to wait) sets `writerWaiting`, then reads tail again; a
// consumer stores tail, then takes `writerWaiting`. Both sequentially consistent (a Dekker pair,
// like the doorbell's): either the producer sees the new tail or the consumer sees the flag.
// Ringing after every read instead made the receiver of each message write the sender's
// doorbell line twice (after the header and after the payload), on its way to its reply: an
// 8 B ping-pong took 0.22 us one way with that, 0.18 us without (bench/results/p2p.md).
//
// Threading: one thread at a time uses a RingWriter, one a RingReader (any two processes).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace shoal::transport::shm {

struct RingControl {
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> writerWaiting;  // Note [Waiting for space]; beside tail, which it guards
};
inline constexpr size_t kRingControlBytes = 64;
static_assert(sizeof(RingControl) == kRingControlBytes);

inline constexpr size_t kRingLine = 64;
// A record's stamp: its first 8 bytes.
inline constexpr size_t kStampBytes = 8;
// The consumer publishes its tail after this much (or a quarter of the ring, if less).
inline constexpr size_t kPublishBytes = 64 << 10;

// The record area of a ring asked to hold `capacity` bytes: whole lines.
inline size_t ringCapacity(size_t capacity) {
  return capacity / kRingLine * kRingLine;
}
// Bytes a ring of `capacity` occupies in a segment (a multiple of 64: rings lie back to back).
inline size_t ringBytes(size_t capacity) {
  return kRingControlBytes + ringCapacity(capacity);
}

// A ring's memory outside a segment, zeroed and 64-byte aligned as a new segment is: for two
// threads of one process (tests, bench/ring_floor.cpp). Owns it; not copyable.
class LocalRingMemory {
 public:
  explicit LocalRingMemory(size_t capacity);
  ~LocalRingMemory();
  LocalRingMemory(const LocalRingMemory&) = delete;
  LocalRingMemory& operator=(const LocalRingMemory&) = delete;
  uint8_t* data() const { return base_; }

 private:
  uint8_t* base_;
};

class RingWriter {
 public:
  RingWriter() = default;
  // `base`: 64-byte aligned, ringBytes(capacity) bytes, zeroed when the ring is new.
  RingWriter(void* base, size_t capacity);
  // Copies a prefix of iov, at most maxBytes, into the ring as one record; returns bytes
  // written. When nothing fit (0), the reader rings this side's doorbell once it frees space
  // (Note [Waiting for space]).
  size_t write(const iovec* iov, int iovcnt, size_t maxBytes);

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t head_ = 0;  // where the next record starts (a line)
  uint64_t tailCache_ = 0;
  uint64_t zeroedTo_ = 0;  // stamps of the lines from head_ to here are zero (Note [Records])
  size_t fits(size_t want) const;
  void copyIn(const iovec* iov, int iovcnt, size_t skip, size_t n, uint64_t at);
};

class RingReader {
 public:
  RingReader() = default;
  RingReader(void* base, size_t capacity);
  // Copies up to n readable bytes out; returns the count. `wakeWriter` is set when the writer
  // waits for the space this freed: the caller rings its doorbell (Note [Waiting for space]).
  // Throws ProtocolError when a stamp is not the one this position can hold.
  size_t read(void* dst, size_t n, bool& wakeWriter);
  // Contiguous readable bytes starting at the read position (within one record).
  std::pair<const uint8_t*, size_t> peek();
  // Releases n peeked bytes; returns whether the writer waits for that space (as read()).
  bool consume(size_t n);
  // The word the next record's stamp will be written to, when nothing is unread: a wait for
  // data can spin on it while it stays 0 (transport::Link::arrivalWatch). Null otherwise.
  const std::atomic<uint64_t>* emptyWatch() const;

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t tail_ = 0;       // the next unread byte
  uint64_t recordEnd_ = 0;  // the end of the current record's bytes
  uint64_t published_ = 0;  // the tail the writer was last told
  uint64_t publishEvery_ = 0;
  bool nextRecord();
  std::atomic<uint64_t>* stampAt(uint64_t position) const;
};

}  // namespace shoal::transport::shm
