// A shared-memory ring as its reader finds it (transport/shm/ring.h): the ring's memory is
// written by the peer process, so every stamp, length and the control block are outside bytes.
// The input is a read pattern byte, then the image of a 4096-byte ring (control block and
// records; what is missing stays zero). The reader takes what it finds by copy and by
// peek/consume; then a writer on the same image (its control block as found) writes a message.
//
// Oracle: only typed errors escape (a stamp out of step is a ProtocolError); a peek hands out
// bytes inside the ring, never more than a read asked for; the sanitizers catch any access
// outside the ring's memory.
#include <algorithm>
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "transport/shm/ring.h"

using namespace shoal;
using namespace shoal::transport::shm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "shm_ring";
  constexpr size_t kCapacity = 4096;
  if (size < 1) return 0;
  uint8_t pattern = data[0];
  LocalRingMemory memory(kCapacity);
  std::memcpy(memory.data(), data + 1, std::min(size - 1, ringBytes(kCapacity)));
  const uint8_t* begin = memory.data() + kRingControlBytes;
  const uint8_t* end = begin + ringCapacity(kCapacity);

  fuzz::expectTypedErrors(kTarget, [&] {
    RingReader reader(memory.data(), kCapacity);
    uint8_t out[kCapacity];
    for (int step = 0; step < 64; ++step) {
      const size_t want = 1 + (pattern * 37u + static_cast<unsigned>(step) * 101u) % kCapacity;
      size_t got = 0;
      if ((pattern >> (step % 8)) & 1) {
        bool wake = false;
        got = reader.read(out, want, wake);
        if (got > want) fuzz::finding(kTarget, "read returned more than was asked");
      } else {
        auto [p, avail] = reader.peek();
        if (avail > 0 && (p < begin || p + avail > end)) {
          fuzz::finding(kTarget, "peek handed out bytes outside the ring");
        }
        got = std::min(avail, want);
        if (got > 0) std::memcpy(out, p, got);
        reader.consume(got);
      }
      if (got == 0) break;
    }
  });
  fuzz::expectTypedErrors(kTarget, [&] {
    RingWriter writer(memory.data(), kCapacity);
    uint8_t message[100];
    std::memset(message, pattern, sizeof message);
    iovec iov[2] = {{message, 48}, {message + 48, sizeof message - 48}};
    (void)writer.write(iov, 2, sizeof message);
  });
  return 0;
}
