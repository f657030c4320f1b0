// The slots an elastic job with host discovery may place workers on (run/host_discovery.h):
// what the last good discovery run offered, which slots hold a running worker, and which had a
// worker fail. Pure bookkeeping for the launcher: no processes, no I/O.
//
// Note [Failed slots]: growth never refills a slot whose worker failed, only a restart counted
// against --max-restarts does, so a host that kills every worker it gets cannot make the job
// start workers in a loop.
//
// Threading: not thread-safe (the launcher's one thread).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "run/hosts.h"

namespace shoal::run {

class SlotPool {
 public:
  // The hosts now offered (a discovery run's result); slots taken stay taken.
  void offer(std::vector<HostSlots> hosts) { offered_ = std::move(hosts); }
  const std::vector<HostSlots>& offered() const { return offered_; }
  // "host:slots,host:slots", for the launcher's messages.
  static std::string describe(const std::vector<HostSlots>& hosts);

  // Whether `p`'s host is offered with more than p.localRank slots.
  bool offers(const Placement& p) const;
  bool occupied(const Placement& p) const { return taken_.count(key(p)) > 0; }

  // A worker starts on `p` / ended there (failed: Note [Failed slots]).
  void occupy(const Placement& p) { taken_.insert(key(p)); }
  void release(const Placement& p, bool failed);

  // The first offered slot that is free, in the hosts' order, skipping slots whose worker
  // failed unless `failedToo`; its localSize is its host's offered slots.
  std::optional<Placement> freeSlot(bool failedToo) const;

 private:
  using Key = std::pair<std::string, int>;  // host, local rank
  static Key key(const Placement& p) { return {p.host, p.localRank}; }
  std::vector<HostSlots> offered_;
  std::set<Key> taken_, failed_;
};

}  // namespace shoal::run
