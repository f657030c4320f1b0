// A doorbell is how a rank sleeps until a shared-memory peer has done something for it.
//
// Each rank owns one doorbell word in shared memory that all its local peers map. A peer that
// writes into a ring this rank reads, or frees space in a ring this rank waits to write (Note
// [Waiting for space] in transport/shm/ring.h), rings it:
// increments `seq` and, only if the owner announced it is sleeping, wakes it with FUTEX_WAKE.
// The owner reads `seq` before trying to make progress and sleeps with FUTEX_WAIT on that value,
// so a ring that happens between the check and the sleep makes the wait return at once. The
// `sleeping` flag and `seq` form a Dekker pair (both sequentially consistent): either the ringer
// sees the sleeper or the sleeper sees the new seq.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/deadline.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shoal::transport::shm {

// One step of a spin on shared memory: tells the core it spins (x86 PAUSE).
inline void cpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

struct alignas(64) DoorbellWord {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleeping;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Wakes the owner of `w` (any thread, any process that maps it).
void ring(DoorbellWord* w);

// Owner only: spins up to `spin`, then yields the core for up to `yield` (see the .cpp), then
// sleeps until seq != seen or `timeout` passed; all three counted from `start` (the caller's
// clock read, taken just before). Returns true if the bell rang. With `also`, the
// spin and the yield also end as soon as *also is nonzero (the stamp of a ring's next record:
// data arrived there, seen before the bell rings); the sleep waits on the bell alone, which
// every writer rings.
bool waitForRing(DoorbellWord* w, uint32_t seen, Duration spin, Duration yield, Duration timeout,
                 Clock::time_point start, const std::atomic<uint64_t>* also = nullptr);

}  // namespace shoal::transport::shm
