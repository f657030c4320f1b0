#include "run/sweep/trial_slots.h"

#include <fmt/format.h>

#include "common/error.h"
#include "run/slot_pool.h"

namespace shoal::run::sweep {

std::vector<HostSlots> TrialAllocation::hosts() const {
  std::vector<HostSlots> out;
  for (const TrialSlot& s : slots) {
    if (out.empty() || out.back().host != s.host) {
      out.push_back({s.host, 1});
    } else {
      ++out.back().slots;
    }
  }
  return out;
}

std::string TrialAllocation::hostList() const {
  return SlotPool::describe(hosts());
}

std::string TrialAllocation::slotList() const {
  std::string out;
  for (const TrialSlot& s : slots)
    out += fmt::format("{}{}:{}", out.empty() ? "" : ",", s.host, s.index);
  return out;
}

TrialSlots::TrialSlots(const std::vector<HostSlots>& hosts) {
  if (hosts.empty()) SHOAL_THROW(InvalidArgument, "--hosts: no hosts");
  for (const HostSlots& h : hosts) {
    if (h.slots < 1) SHOAL_THROW(InvalidArgument, "host '{}': {} slots", h.host, h.slots);
    bool merged = false;
    for (HostSlots& known : hosts_) {
      if (known.host == h.host) {
        known.slots += h.slots;
        merged = true;
      }
    }
    if (!merged) hosts_.push_back(h);
    total_ += h.slots;
  }
  for (const HostSlots& h : hosts_) busy_.emplace_back(static_cast<size_t>(h.slots), false);
  free_ = total_;
}

void TrialSlots::checkFits(int ranks) const {
  if (ranks > total_) {
    SHOAL_THROW(InvalidArgument,
                "ranks_per_trial {} is more than the {} slots of the hosts ({}): no trial could "
                "start",
                ranks, total_, SlotPool::describe(hosts_));
  }
  if (ranks < 1) SHOAL_THROW(InvalidArgument, "ranks_per_trial must be at least 1, got {}", ranks);
}

std::optional<TrialAllocation> TrialSlots::take(int ranks) {
  checkFits(ranks);
  if (ranks > free_) return std::nullopt;
  TrialAllocation a;
  for (size_t h = 0; h < hosts_.size() && static_cast<int>(a.slots.size()) < ranks; ++h) {
    for (size_t s = 0; s < busy_[h].size() && static_cast<int>(a.slots.size()) < ranks; ++s) {
      if (busy_[h][s]) continue;
      busy_[h][s] = true;
      a.slots.push_back({hosts_[h].host, static_cast<int>(s)});
    }
  }
  free_ -= ranks;
  return a;
}

size_t TrialSlots::hostIndex(const std::string& host) const {
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (hosts_[h].host == host) return h;
  }
  SHOAL_THROW(InvalidArgument, "release: host '{}' is not one of the sweep's hosts", host);
}

void TrialSlots::release(const TrialAllocation& allocation) {
  for (const TrialSlot& s : allocation.slots) {
    const size_t h = hostIndex(s.host);
    if (s.index < 0 || s.index >= hosts_[h].slots || !busy_[h][static_cast<size_t>(s.index)]) {
      SHOAL_THROW(InvalidArgument, "release: slot {}:{} is not held", s.host, s.index);
    }
  }
  for (const TrialSlot& s : allocation.slots) {
    busy_[hostIndex(s.host)][static_cast<size_t>(s.index)] = false;
    ++free_;
  }
}

}  // namespace shoal::run::sweep
