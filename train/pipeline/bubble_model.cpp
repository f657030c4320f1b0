// simulatedBubble(): the idle time a schedule leaves, from its lists alone. Every rank runs its
// list in order from time 0 with its own clock; a compute advances the clock by its cost, a send
// stamps its queue entry with the clock (plus the transfer cost) and costs nothing, a receive
// moves the clock to that stamp if it is later. Matching follows the same per-(boundary,
// direction) FIFO order as check(), which runs first, so every receive finds its send.
#include <algorithm>
#include <deque>
#include <vector>

#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

std::vector<double> simulatedBubble(const Schedule& s, double forwardCost, double backwardCost,
                                    double transferCost) {
  if (!(forwardCost >= 0 && backwardCost >= 0 && transferCost >= 0 &&
        forwardCost + backwardCost > 0)) {
    SHOAL_THROW(InvalidArgument,
                "simulatedBubble: costs forward {}, backward {}, transfer {} (need >= 0, and "
                "forward + backward > 0)",
                forwardCost, backwardCost, transferCost);
  }
  check(s);

  const auto p = static_cast<size_t>(s.stages);
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0), busy(p, 0.0);
  std::vector<std::deque<double>> arrivals(static_cast<size_t>(2 * s.virtualStages()));
  auto queue = [&](int rank, const Action& a) -> std::deque<double>& {
    const bool gradient =
        a.kind == ActionKind::kSendGradient || a.kind == ActionKind::kRecvGradient;
    return arrivals[static_cast<size_t>(2 * s.boundary(rank, a) + (gradient ? 1 : 0))];
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < p; ++r) {
      const auto& list = s.ranks[r];
      for (; next[r] < list.size(); ++next[r], moved = true) {
        const Action& a = list[next[r]];
        const int rank = static_cast<int>(r);
        if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) {
          const double cost = a.kind == ActionKind::kForward ? forwardCost : backwardCost;
          clock[r] += cost;
          busy[r] += cost;
        } else if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient) {
          queue(rank, a).push_back(clock[r] + transferCost);
        } else {
          auto& q = queue(rank, a);
          if (q.empty()) break;
          clock[r] = std::max(clock[r], q.front());
          q.pop_front();
        }
      }
    }
  }

  const double step = *std::max_element(clock.begin(), clock.end());
  std::vector<double> idle(p);
  for (size_t r = 0; r < p; ++r) idle[r] = (step - busy[r]) / step;
  return idle;
}

}  // namespace shoal::train::pipeline
