// The slots of `shoal sweep --hosts/--hostfile` and which trial holds each: a trial of k ranks
// takes k free slots, first fit in the hosts' order (lowest slot first on each host; a trial may
// span hosts), and gives them back when it ends, whatever the outcome. A trial starts only when
// enough slots are free, so no slot ever serves two trials at once and the trials running are
// bounded by the slots as well as by `parallel`.
//
// Rank order: take() lists the slots as `shoal run --hosts` places ranks (run/hosts.h's
// placeRanks: hosts in order, each up to its count), so rank r of the trial runs on slots[r].
//
// Pure bookkeeping: no processes, no I/O, no name resolution. Not thread-safe (the sweep's one
// thread).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "run/hosts.h"

namespace shoal::run::sweep {

struct TrialSlot {
  std::string host;
  int index = 0;  // 0 .. the host's slots - 1
  bool operator==(const TrialSlot&) const = default;
};

// The slots one trial holds, in rank order.
struct TrialAllocation {
  std::vector<TrialSlot> slots;
  // Per host, in order: what the trial's `shoal run --hosts` gets ("nodeA:2,nodeB:1").
  std::vector<HostSlots> hosts() const;
  std::string hostList() const;
  // Every slot, in rank order: "nodeA:0,nodeA:1,nodeB:0".
  std::string slotList() const;
};

class TrialSlots {
 public:
  // A host named twice counts once, with the slots of both entries. InvalidArgument when there
  // are no hosts.
  explicit TrialSlots(const std::vector<HostSlots>& hosts);

  const std::vector<HostSlots>& hosts() const { return hosts_; }
  int total() const { return total_; }
  int free() const { return free_; }

  // InvalidArgument (one line) when a trial of `ranks` can never start: more ranks than slots.
  void checkFits(int ranks) const;

  // `ranks` free slots, first fit; nullopt when fewer are free now (the trial waits for a
  // release). InvalidArgument as checkFits() when it can never fit.
  std::optional<TrialAllocation> take(int ranks);
  // Gives back what take() returned. A slot not held is a bug (InvalidArgument).
  void release(const TrialAllocation& allocation);

 private:
  size_t hostIndex(const std::string& host) const;
  std::vector<HostSlots> hosts_;
  std::vector<std::vector<bool>> busy_;  // per host, per slot
  int total_ = 0, free_ = 0;
};

}  // namespace shoal::run::sweep
