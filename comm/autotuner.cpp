#include "comm/autotuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/statistics.h"

namespace shoal::comm {

Autotuner::Autotuner(std::shared_ptr<Group> group, std::vector<std::string> labels,
                     AutotuneOptions options)
    : group_(std::move(group)), labels_(std::move(labels)), options_(options) {
  SHOAL_CHECK(group_ != nullptr, "Autotuner needs a group");
  if (labels_.empty() || options_.warmupSteps < 0 || options_.stepsPerRound < 1) {
    SHOAL_THROW(InvalidArgument,
                "Autotuner: needs at least one candidate, warmupSteps >= 0 and stepsPerRound >= "
                "1 (got {} candidates, {}, {})",
                labels_.size(), options_.warmupSteps, options_.stepsPerRound);
  }
  alive_.resize(labels_.size());
  std::iota(alive_.begin(), alive_.end(), size_t{0});
}

size_t Autotuner::best() const {
  if (!done()) SHOAL_THROW(InvalidArgument, "Autotuner: the search is not over");
  return alive_[0];
}

bool Autotuner::record(double seconds) {
  if (done()) return false;
  if (!std::isfinite(seconds) || seconds < 0) {
    SHOAL_THROW(InvalidArgument, "Autotuner: a step took {} s", seconds);
  }
  if (stepInTrial_++ >= options_.warmupSteps) times_.push_back(seconds);
  const int steps = options_.stepsPerRound << round_;
  if (static_cast<int>(times_.size()) < steps) return false;
  endTrial();
  return done();
}

void Autotuner::endTrial() {
  double seconds = median(times_);
  // The slowest rank's: a step is as slow as its slowest rank, and all ranks agree on it.
  allreduce(*group_, &seconds, 1, DataType::kFloat64, ReduceOp::kMax);
  trials_.push_back({alive_[next_], round_, static_cast<int>(times_.size()), seconds});
  roundSeconds_.push_back(seconds);
  times_.clear();
  stepInTrial_ = 0;
  if (++next_ < alive_.size()) return;
  // The round is over: keep the faster half (ties to the earlier candidate, the same on every
  // rank since the times are).
  std::vector<size_t> order(alive_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return roundSeconds_[a] < roundSeconds_[b]; });
  std::vector<size_t> kept;
  for (size_t i = 0; i < (alive_.size() + 1) / 2; ++i) kept.push_back(alive_[order[i]]);
  alive_ = std::move(kept);
  roundSeconds_.clear();
  next_ = 0;
  ++round_;
}

std::string Autotuner::describe() const {
  // Each candidate's last trial, fastest of the furthest round first.
  std::vector<AutotuneTrial> last(labels_.size());
  std::vector<bool> tried(labels_.size(), false);
  for (const auto& t : trials_) {
    last[t.candidate] = t;
    tried[t.candidate] = true;
  }
  std::vector<size_t> order;
  for (size_t c = 0; c < labels_.size(); ++c) {
    if (tried[c]) order.push_back(c);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (last[a].round != last[b].round) return last[a].round > last[b].round;
    return last[a].seconds < last[b].seconds;
  });
  std::string out = done() ? fmt::format("chose {}", labels_[best()]) : "searching";
  if (order.empty()) return out;
  out += ":";
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& t = last[order[i]];
    out += fmt::format("{} {} {:.2f} ms per step (round {}, {} steps)", i == 0 ? "" : ";",
                       labels_[order[i]], t.seconds * 1e3, t.round + 1, t.steps);
  }
  return out;
}

}  // namespace shoal::comm
