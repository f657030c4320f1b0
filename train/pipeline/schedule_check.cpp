// check(): runs all ranks' lists together against the semantics in schedule.h, without running
// any model. Each round gives every rank, rank 0 first, one action: a compute or a send always
// runs (after its local checks), a receive runs only if the FIFO queue of its (boundary,
// direction) holds a send, whose micro-batch must be the receive's. When a round moves nothing,
// the unfinished ranks all wait at receives: from the lowest of them the wait is followed rank
// to rank (a receive waits on its peer) until it closes a cycle or reaches a rank whose list
// ended. When every list ended, the queues must be empty and every (virtual stage, micro-batch)
// must have run its forward and backward.
// Matching is decided by list order alone, never by timing, so lists this accepts run to the
// end however long each action takes.
#include <algorithm>
#include <deque>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

namespace {

// What has happened to one micro-batch on one virtual stage.
enum : uint8_t {
  kForwardRan = 1,
  kBackwardRan = 2,
  kActivationIn = 4,
  kGradientIn = 8,
  kActivationOut = 16,
  kGradientOut = 32,
};

struct Posted {
  int microBatch;
  int rank;
  size_t index;
};

class Simulation {
 public:
  explicit Simulation(const Schedule& s)
      : s_(s),
        p_(s.stages),
        m_(s.microBatches),
        v_(s.chunks),
        last_(s.virtualStages() - 1),
        next_(static_cast<size_t>(s.stages), 0),
        queues_(static_cast<size_t>(2 * s.virtualStages())),
        state_(static_cast<size_t>(s.virtualStages()) * static_cast<size_t>(s.microBatches), 0) {}

  void run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < p_; ++r) {
        if (!finished(r) && step(r)) {
          ++next_[static_cast<size_t>(r)];
          moved = true;
        }
      }
    }
    for (int r = 0; r < p_; ++r) {
      if (!finished(r)) reportStuck(r);
    }
    reportUnreceived();
    reportNeverRun();
  }

 private:
  const std::vector<Action>& list(int rank) const { return s_.ranks[static_cast<size_t>(rank)]; }
  size_t next(int rank) const { return next_[static_cast<size_t>(rank)]; }
  bool finished(int rank) const { return next(rank) == list(rank).size(); }
  uint8_t& state(int stage, int mb) {
    return state_[static_cast<size_t>(stage) * static_cast<size_t>(m_) + static_cast<size_t>(mb)];
  }
  std::deque<Posted>& queue(int boundary, bool gradient) {
    return queues_[static_cast<size_t>(2 * boundary + (gradient ? 1 : 0))];
  }

  std::string where(int rank, size_t index) const {
    return fmt::format("rank {} action {} {}", rank, index, describe(list(rank)[index]));
  }

  [[noreturn]] void fail(std::string_view what) const {
    SHOAL_THROW(InvalidArgument, "schedule {} (p {}, m {}, v {}): {}", s_.name, p_, m_, v_, what);
  }
  [[noreturn]] void fail(int rank, size_t index, std::string_view why) const {
    fail(fmt::format("{}: {}", where(rank, index), why));
  }

  // Runs rank's next action; false when it is a receive with nothing to match yet.
  bool step(int r) {
    const size_t i = next(r);
    const Action& a = list(r)[i];
    if (a.kind > ActionKind::kRecvGradient) {
      fail(r, i, fmt::format("unknown action kind {}", static_cast<int>(a.kind)));
    }
    if (a.chunk < 0 || a.chunk >= v_) fail(r, i, fmt::format("chunk out of range 0..{}", v_ - 1));
    if (a.microBatch < 0 || a.microBatch >= m_) {
      fail(r, i, fmt::format("micro-batch out of range 0..{}", m_ - 1));
    }
    const int stage = s_.virtualStage(r, a.chunk);
    uint8_t& st = state(stage, a.microBatch);
    auto once = [&](uint8_t bit, std::string_view twice) {
      if (st & bit) fail(r, i, fmt::format("{} twice on virtual stage {}", twice, stage));
      st |= bit;
    };
    auto needs = [&](uint8_t bit, ActionKind earlier) {
      if (!(st & bit)) {
        fail(r, i,
             fmt::format("runs before its input: no earlier {} on this rank",
                         describe({earlier, a.microBatch, a.chunk})));
      }
    };
    switch (a.kind) {
      case ActionKind::kForward:
        if (stage > 0) needs(kActivationIn, ActionKind::kRecvActivation);
        once(kForwardRan, "runs");
        return true;
      case ActionKind::kBackward:
        needs(kForwardRan, ActionKind::kForward);
        if (stage < last_) needs(kGradientIn, ActionKind::kRecvGradient);
        once(kBackwardRan, "runs");
        return true;
      case ActionKind::kSendActivation:
        if (stage == last_) fail(r, i, "the last virtual stage sends no activation");
        needs(kForwardRan, ActionKind::kForward);
        once(kActivationOut, "sent");
        queue(stage, false).push_back({a.microBatch, r, i});
        return true;
      case ActionKind::kSendGradient:
        if (stage == 0) fail(r, i, "virtual stage 0 sends no gradient");
        needs(kBackwardRan, ActionKind::kBackward);
        once(kGradientOut, "sent");
        queue(stage - 1, true).push_back({a.microBatch, r, i});
        return true;
      case ActionKind::kRecvActivation:
        if (stage == 0) fail(r, i, "virtual stage 0 receives no activation");
        return receive(r, i, queue(stage - 1, false), kActivationIn);
      case ActionKind::kRecvGradient:
        if (stage == last_) fail(r, i, "the last virtual stage receives no gradient");
        return receive(r, i, queue(stage, true), kGradientIn);
    }
    return true;
  }

  bool receive(int r, size_t i, std::deque<Posted>& q, uint8_t bit) {
    const Action& a = list(r)[i];
    uint8_t& st = state(s_.virtualStage(r, a.chunk), a.microBatch);
    if (st & bit) {
      fail(r, i, fmt::format("received twice on virtual stage {}", s_.virtualStage(r, a.chunk)));
    }
    if (q.empty()) return false;
    const Posted sent = q.front();
    if (sent.microBatch != a.microBatch) {
      fail(r, i,
           fmt::format("its matching send, {}, carries micro-batch {}",
                       where(sent.rank, sent.index), sent.microBatch));
    }
    q.pop_front();
    st |= bit;
    return true;
  }

  [[noreturn]] void reportStuck(int start) const {
    std::vector<int> path;
    std::vector<int> seenAt(static_cast<size_t>(p_), -1);
    for (int r = start;;) {
      if (finished(r)) {
        const int waiter = path.back();
        fail(waiter, next(waiter),
             fmt::format("never matched: rank {} ended its list without sending it{}", r,
                         waiter == start ? "" : fmt::format(" (rank {} waits behind it)", start)));
      }
      if (seenAt[static_cast<size_t>(r)] >= 0) {
        std::vector<int> cycle(path.begin() + seenAt[static_cast<size_t>(r)], path.end());
        std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
        std::string chain;
        for (size_t k = 1; k < cycle.size(); ++k) {
          chain += fmt::format("{}, which waits on ", where(cycle[k], next(cycle[k])));
        }
        fail(cycle[0], next(cycle[0]),
             fmt::format("deadlock: waits on {}rank {}", chain, cycle[0]));
      }
      seenAt[static_cast<size_t>(r)] = static_cast<int>(path.size());
      path.push_back(r);
      r = s_.peer(r, list(r)[next(r)]);
    }
  }

  void reportUnreceived() const {
    const Posted* first = nullptr;
    for (const auto& q : queues_) {
      for (const Posted& sent : q) {
        if (!first || std::tie(sent.rank, sent.index) < std::tie(first->rank, first->index)) {
          first = &sent;
        }
      }
    }
    if (first) fail(first->rank, first->index, "nobody receives it");
  }

  void reportNeverRun() {
    for (int r = 0; r < p_; ++r) {
      for (int c = 0; c < v_; ++c) {
        const int stage = s_.virtualStage(r, c);
        for (int mb = 0; mb < m_; ++mb) {
          for (auto [bit, kind] : {std::pair{kForwardRan, ActionKind::kForward},
                                   std::pair{kBackwardRan, ActionKind::kBackward}}) {
            if (!(state(stage, mb) & bit)) {
              fail(
                  fmt::format("rank {}: {} never runs (virtual stage {}; the list ends after {} "
                              "actions)",
                              r, describe({kind, mb, c}), stage, list(r).size()));
            }
          }
        }
      }
    }
  }

  const Schedule& s_;
  const int p_, m_, v_, last_;
  std::vector<size_t> next_;                // per rank: index of its next action
  std::vector<std::deque<Posted>> queues_;  // per (boundary, direction): sends not yet received
  std::vector<uint8_t> state_;              // per (virtual stage, micro-batch): the k* bits
};

}  // namespace

void check(const Schedule& schedule) {
  const Schedule& s = schedule;
  if (s.stages < 1 || s.microBatches < 1 || s.chunks < 1) {
    SHOAL_THROW(InvalidArgument, "schedule {}: p {}, m {}, v {} (need >= 1 each)", s.name, s.stages,
                s.microBatches, s.chunks);
  }
  if (static_cast<int>(s.ranks.size()) != s.stages) {
    SHOAL_THROW(InvalidArgument, "schedule {}: {} rank lists for {} stages", s.name, s.ranks.size(),
                s.stages);
  }
  Simulation(s).run();
}

}  // namespace shoal::train::pipeline
