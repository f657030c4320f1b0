// What a parameter server waits for, under its lock: holds on the shard (Note [Shard access] in
// ps/shard_access.h), the initial values, a step's other contributions; and the workers' clocks
// and the shard's versions those waits read (ps/server_state.h).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

// ---- holds on the shard (Note [Shard access] in ps/shard_access.h)

void Server::beginWrite(std::unique_lock<std::mutex>& lock) {
  access_.queueWriter();
  try {
    waitUntil(
        lock, [&] { return access_.canWrite(); },
        [&] {
          return fmt::format("an update waited for {} to finish",
                             access_.writerActive() ? "another update" : "pull replies being sent");
        });
  } catch (...) {
    access_.withdrawWriter();
    cv_.notify_all();
    throw;
  }
  access_.beginWrite();
}

void Server::endWrite(Scratch& sc) {
  access_.endWrite();
  sc.writing = false;
  cv_.notify_all();
}

void Server::beginRead(std::unique_lock<std::mutex>& lock, Scratch& sc) {
  waitUntil(
      lock, [&] { return access_.canRead(); },
      [] { return std::string("a pull waited for an update to finish"); });
  access_.beginRead();
  sc.reading = true;
}

void Server::endRead(Scratch& sc) {
  if (!sc.reading) return;
  std::lock_guard<std::mutex> lock(mu_);
  access_.endRead();
  sc.reading = false;
  cv_.notify_all();
}

// ---- waiting (waitUntil in ps/server_state.h)

void Server::waitInitialized(std::unique_lock<std::mutex>& lock) {
  waitUntil(
      lock, [&] { return initialized_; },
      [] { return std::string("worker 0 has not sent the initial values"); });
}

void Server::waitForStep(std::unique_lock<std::mutex>& lock, int w, const Target& t,
                         uint64_t step) {
  for (size_t i = t.first; i < t.last; ++i) {
    if (shard_->version(i) > step) {
      SHOAL_THROW(InvalidArgument, "step {} was already applied (the shard is at step {})", step,
                  shard_->version(i));
    }
    if (shard_->version(i) == step && shard_->hasArrived(i, w)) {
      SHOAL_THROW(InvalidArgument, "step {} was already pushed by this worker", step);
    }
  }
  // A worker may push the next step before the others finished this one: it waits here
  // (its slot still holds the current step's contribution).
  waitUntil(
      lock, [&] { return minVersion(t) >= step; },
      [&] { return fmt::format("push of step {}: {}", step, missing(t)); });
}

uint64_t Server::minVersion(const Target& t) const {
  uint64_t v = UINT64_MAX;
  for (size_t i = t.first; i < t.last; ++i) v = std::min(v, shard_->version(i));
  return v == UINT64_MAX ? minClock() : v;
}

std::string Server::missing(const Target& t) const {
  if (t.first == t.last) return "waiting";
  std::vector<int> absent;
  for (int w = 0; w < workers_; ++w) {
    if (!shard_->hasArrived(t.first, w)) absent.push_back(w);
  }
  return fmt::format("step {} still waits for worker(s) {}", shard_->version(t.first),
                     fmt::join(absent, ", "));
}

uint64_t Server::minClock(int pusher, uint64_t clock) const {
  uint64_t m = UINT64_MAX, all = 0;
  for (int w = 0; w < workers_; ++w) {
    const uint64_t c = w == pusher ? std::max(clocks_[w], clock) : clocks_[w];
    all = std::max(all, c);
    if (!done_[w]) m = std::min(m, c);
  }
  return m == UINT64_MAX ? all : m;
}

}  // namespace shoal::ps::detail
