// The shared-memory ring of records (transport/shm/ring.h) on its own: two threads, one ring in
// ordinary memory, no links or endpoints around it.
#include "transport/shm/ring.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"

namespace shoal::transport::shm {
namespace {

uint8_t patternByte(uint64_t i) {
  // Bytes that often look like stamps of earlier laps if a reader took them for one.
  return static_cast<uint8_t>((i * 2654435761u) >> 13);
}

// A writer and a reader in two threads move `total` bytes in random pieces: the writer as
// records of 1 to 3 iovecs, the reader alternately by read() and peek()/consume(). When nothing
// fits, the writer waits only for the reader's wake-up (Note [Waiting for space]): a lost one
// fails the test at its deadline rather than passing by polling.
void streamThrough(size_t capacity, size_t total, size_t maxPiece, uint32_t seed) {
  LocalRingMemory memory(capacity);
  RingWriter writer(memory.data(), capacity);
  RingReader reader(memory.data(), capacity);
  std::atomic<bool> woken{false};
  std::atomic<bool> failed{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto late = [&] { return std::chrono::steady_clock::now() > deadline || failed.load(); };
  size_t waits = 0;

  std::thread producer([&] {
    std::mt19937 rng(seed);
    std::vector<uint8_t> src(maxPiece);
    uint64_t sent = 0;
    while (sent < total && !late()) {
      const size_t want = std::min<size_t>(total - sent, 1 + rng() % maxPiece);
      for (size_t i = 0; i < want; ++i) src[i] = patternByte(sent + i);
      iovec iov[3];
      const int n = 1 + static_cast<int>(rng() % 3);
      size_t at = 0;
      for (int i = 0; i < n; ++i) {
        const size_t len = i == n - 1 ? want - at : std::min<size_t>(want - at, rng() % 64);
        iov[i] = {src.data() + at, len};
        at += len;
      }
      const size_t wrote = writer.write(iov, n, want);
      if (wrote == 0) {
        ++waits;
        while (!woken.exchange(false) && !late()) std::this_thread::yield();
        continue;
      }
      sent += wrote;  // a partial write: the rest goes next round, regenerated at its offset
    }
  });

  std::mt19937 rng(seed + 1);
  std::vector<uint8_t> dst(maxPiece);
  uint64_t got = 0;
  std::string error;
  while (got < total && !late()) {
    size_t n = 0;
    bool wake = false;
    try {
      if (rng() % 2) {
        n = reader.read(dst.data(), std::min<size_t>(total - got, 1 + rng() % maxPiece), wake);
      } else {
        auto [p, avail] = reader.peek();
        n = std::min<size_t>({avail, total - got, 1 + rng() % maxPiece});
        std::memcpy(dst.data(), p, n);
        wake = reader.consume(n);
      }
    } catch (const ProtocolError& e) {  // e.g. a stale stamp taken for a record
      error = e.what();
      failed = true;
      break;
    }
    if (wake) woken.store(true);
    for (size_t i = 0; i < n && error.empty(); ++i) {
      if (dst[i] != patternByte(got + i)) error = "byte " + std::to_string(got + i) + " differs";
    }
    if (!error.empty()) {
      failed = true;
      break;
    }
    got += n;
    if (n == 0) std::this_thread::yield();
  }
  producer.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, total) << "stopped at the deadline";
  // The ring is far smaller than the stream: the writer had to wait, and was woken every time.
  EXPECT_GT(waits, 0u);
}

TEST(Ring, ARandomStreamArrivesIntactOverThousandsOfLaps) {
  streamThrough(4096, 16 << 20, 3000, 7);
}

TEST(Ring, RingsOfOddSizesUseWholeLines) {
  EXPECT_EQ(ringBytes(5000), kRingControlBytes + 4992);
  streamThrough(5000, 4 << 20, 6000, 11);
}

TEST(Ring, LargePiecesWrapAndComeBackInQuarters) {
  streamThrough(256 << 10, 64 << 20, 200 << 10, 13);
}

TEST(Ring, SmallMessagesTakeOneLineEach) {
  LocalRingMemory memory(4096);
  RingWriter writer(memory.data(), 4096);
  RingReader reader(memory.data(), 4096);
  const std::atomic<uint64_t>* watch = reader.emptyWatch();
  ASSERT_NE(watch, nullptr);
  EXPECT_EQ(watch->load(), 0u);
  uint8_t message[56];
  std::memset(message, 0xab, sizeof message);
  iovec iov{message, sizeof message};
  ASSERT_EQ(writer.write(&iov, 1, sizeof message), sizeof message);
  // The watched word is the record's stamp, on the line that also holds all 56 bytes.
  EXPECT_NE(watch->load(), 0u);
  EXPECT_EQ(reader.emptyWatch(), nullptr);  // bytes are waiting
  auto [p, avail] = reader.peek();
  EXPECT_EQ(avail, sizeof message);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(watch) + kStampBytes, p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) / kRingLine,
            reinterpret_cast<uintptr_t>(p + avail - 1) / kRingLine);
  reader.consume(avail);
  // The next record goes on the next line, whose stamp the writer zeroed.
  const std::atomic<uint64_t>* next = reader.emptyWatch();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(next) - reinterpret_cast<const uint8_t*>(watch),
            static_cast<ptrdiff_t>(kRingLine));
}

TEST(Ring, AStampOutOfStepIsAProtocolError) {
  LocalRingMemory memory(4096);
  RingWriter writer(memory.data(), 4096);
  RingReader reader(memory.data(), 4096);
  uint8_t message[100] = {};
  iovec iov{message, sizeof message};
  ASSERT_EQ(writer.write(&iov, 1, sizeof message), sizeof message);
  // The stamp of line 0 names line 5 (as a stale record of another position would).
  auto* stamp = reinterpret_cast<std::atomic<uint64_t>*>(memory.data() + kRingControlBytes);
  stamp->store(uint64_t{6} << 32 | 100);
  bool wake = false;
  try {
    reader.read(message, sizeof message, wake);
    ADD_FAILURE() << "a stamp of another line was taken";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("ring out of step"), std::string::npos) << e.what();
  }
  // A length past the ring is refused the same way, before a byte is copied.
  RingReader again(memory.data(), 4096);
  stamp->store(uint64_t{1} << 32 | 4096);
  EXPECT_THROW(again.peek(), ProtocolError);
}

}  // namespace
}  // namespace shoal::transport::shm
