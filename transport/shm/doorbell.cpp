#include "transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace shoal::transport::shm {

namespace {
long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in memory mapped by several processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}
}  // namespace

void ring(DoorbellWord* w) {
  w->seq.fetch_add(1, std::memory_order_seq_cst);
  if (w->sleeping.load(std::memory_order_seq_cst) != 0) {
    futex(&w->seq, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

bool waitForRing(DoorbellWord* w, uint32_t seen, Duration spin, Duration yield, Duration timeout,
                 Clock::time_point start, const std::atomic<uint64_t>* also) {
  auto rang = [&] {
    return w->seq.load(std::memory_order_acquire) != seen ||
           (also != nullptr && also->load(std::memory_order_acquire) != 0);
  };
  // Spin briefly: a peer on another core usually answers within microseconds, and a futex
  // round trip costs more than that. Check the clock only every 64 pauses. The bell at every
  // look, even with a ring's word to watch: looking at it only every 16th time made an 8 B
  // ping-pong 3% faster in this machine's slow mode, and 4 ranks' all-reduce of 1-4 MiB (on 2
  // cores) 10-35% slower, its other peers' rings waiting for the 16th look.
  for (int i = 0;; ++i) {
    if (rang()) return true;
    if ((i & 63) == 63 && Clock::now() - start >= spin) break;
    cpuRelax();
  }
  // Then yield: with more ranks than cores the peer we wait for is often runnable on this very
  // core, and sched_yield hands it the core at once, where a futex sleep would idle the core
  // and pay a wake-up (on a VM, an IPI and a VM exit) per message. Bounded, like the spin.
  while (Clock::now() - start < spin + yield) {
    if (rang()) return true;
    sched_yield();
  }
  auto left = timeout - (Clock::now() - start);
  if (left <= Duration(0)) return false;
  timespec ts{static_cast<time_t>(left.count() / 1'000'000'000),
              static_cast<long>(left.count() % 1'000'000'000)};
  w->sleeping.store(1, std::memory_order_seq_cst);
  if (w->seq.load(std::memory_order_seq_cst) == seen) {
    futex(&w->seq, FUTEX_WAIT, seen, &ts);
  }
  w->sleeping.store(0, std::memory_order_relaxed);
  return w->seq.load(std::memory_order_acquire) != seen;
}

}  // namespace shoal::transport::shm
