#include "run/slot_pool.h"

#include <fmt/format.h>

#include <algorithm>

namespace shoal::run {

std::string SlotPool::describe(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts)
    out += fmt::format("{}{}:{}", out.empty() ? "" : ",", h.host, h.slots);
  return out;
}

bool SlotPool::offers(const Placement& p) const {
  return std::any_of(offered_.begin(), offered_.end(),
                     [&](const HostSlots& h) { return h.host == p.host && p.localRank < h.slots; });
}

void SlotPool::release(const Placement& p, bool failed) {
  taken_.erase(key(p));
  if (failed) failed_.insert(key(p));
}

std::optional<Placement> SlotPool::freeSlot(bool failedToo) const {
  for (const auto& h : offered_) {
    for (int s = 0; s < h.slots; ++s) {
      Placement p{h.host, isLocalHost(h.host), s, h.slots};
      if (!occupied(p) && (failedToo || !failed_.count(key(p)))) return p;
    }
  }
  return std::nullopt;
}

}  // namespace shoal::run
