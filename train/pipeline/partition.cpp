#include "train/pipeline/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/error.h"

namespace shoal::train::pipeline {
namespace {

std::string humanBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

void checkLayerCount(const PartitionPlan& plan) {
  SHOAL_CHECK(plan.boundaries.size() >= 2, "a partition plan needs at least one stage");
  SHOAL_CHECK_EQ(static_cast<size_t>(plan.boundaries.back()), plan.layers.size(),
                 "a partition plan's last boundary must be its number of layers");
}

}  // namespace

Boundaries balancedCuts(const std::vector<double>& cost, int parts) {
  const int n = static_cast<int>(cost.size());
  if (parts < 1 || parts > n) {
    SHOAL_THROW(InvalidArgument,
                "balancedCuts: cannot cut {} layers into {} parts (need 1 <= parts <= layers)", n,
                parts);
  }
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(cost[i]) || cost[i] < 0) {
      SHOAL_THROW(InvalidArgument, "balancedCuts: layer {} has cost {}, need finite and >= 0", i,
                  cost[i]);
    }
  }
  // Every part's sum is prefix[j] - prefix[i], computed the same way wherever it is compared,
  // so the choice below does not depend on the order of floating-point additions.
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  // Squares of part sums must stay finite for the tie-break.
  constexpr double kMaxTotal = 1e150;
  if (!(prefix[n] <= kMaxTotal)) {
    SHOAL_THROW(InvalidArgument, "balancedCuts: the costs sum to {}, need at most {}", prefix[n],
                kMaxTotal);
  }
  auto sum = [&](int i, int j) { return prefix[j] - prefix[i]; };

  // best[k][i]: the smallest possible largest part when layers [i, n) are cut into k parts
  // (defined for i <= n - k). Suffixes rather than prefixes, so that the reconstruction walks
  // from the first layer and can prefer the earliest cut.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, kInf));
  for (int i = 0; i < n; ++i) best[1][i] = sum(i, n);
  for (int k = 2; k <= parts; ++k) {
    for (int i = 0; i <= n - k; ++i) {
      double b = kInf;
      // The first part is [i, j); the other k - 1 parts need at least k - 1 layers.
      for (int j = i + 1; j <= n - (k - 1); ++j)
        b = std::min(b, std::max(sum(i, j), best[k - 1][j]));
      best[k][i] = b;
    }
  }
  const double optimum = best[parts][0];

  // Among the cuts whose largest part is the optimum, the one with the smallest sum of squared
  // part sums (the other stages as even as the bottleneck allows: parameter counts tie often).
  // squares[k][i] for layers [i, n) in k parts each within the optimum, evaluated as
  // part0^2 + (part1^2 + (...)) so that a brute force can compute the same value; choice[k][i]
  // is the earliest end of the first part that attains it.
  std::vector<std::vector<double>> squares(parts + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> choice(parts + 1, std::vector<int>(n + 1, -1));
  for (int i = 0; i < n; ++i) {
    if (sum(i, n) <= optimum) squares[1][i] = sum(i, n) * sum(i, n);
    choice[1][i] = n;
  }
  for (int k = 2; k <= parts; ++k) {
    for (int i = 0; i <= n - k; ++i) {
      for (int j = i + 1; j <= n - (k - 1); ++j) {
        const double part = sum(i, j);
        if (part > optimum || squares[k - 1][j] == kInf) continue;
        const double total = part * part + squares[k - 1][j];
        if (total < squares[k][i]) {
          squares[k][i] = total;
          choice[k][i] = j;
        }
      }
    }
  }
  SHOAL_ASSERT(squares[parts][0] < kInf, "no cut within the optimum {}", optimum);

  Boundaries b{0};
  for (int k = parts, pos = 0; k > 1; --k) {
    pos = choice[k][pos];
    b.push_back(pos);
  }
  b.push_back(n);
  return b;
}

Boundaries byParameters(const std::vector<int64_t>& params, int parts) {
  std::vector<double> cost(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] < 0) {
      SHOAL_THROW(InvalidArgument, "byParameters: layer {} has {} parameters, need >= 0", i,
                  params[i]);
    }
    // Exact below 2^53 parameters per model.
    cost[i] = static_cast<double>(params[i]);
  }
  return balancedCuts(cost, parts);
}

Boundaries fromBoundaries(const std::vector<int>& firstLayerOfEachStage, int layers) {
  if (layers < 1) SHOAL_THROW(InvalidArgument, "fromBoundaries: {} layers, need >= 1", layers);
  if (firstLayerOfEachStage.empty()) {
    SHOAL_THROW(InvalidArgument, "fromBoundaries: no stage given (need the first layer of each)");
  }
  if (firstLayerOfEachStage[0] != 0) {
    SHOAL_THROW(InvalidArgument, "fromBoundaries: stage 0 must start at layer 0, not {}",
                firstLayerOfEachStage[0]);
  }
  for (size_t s = 1; s < firstLayerOfEachStage.size(); ++s) {
    const int first = firstLayerOfEachStage[s];
    if (first <= firstLayerOfEachStage[s - 1]) {
      SHOAL_THROW(InvalidArgument,
                  "fromBoundaries: stage {} starts at layer {}, not after stage {}'s {} (stages "
                  "must be non-empty, in order)",
                  s, first, s - 1, firstLayerOfEachStage[s - 1]);
    }
    if (first >= layers) {
      SHOAL_THROW(InvalidArgument,
                  "fromBoundaries: stage {} starts at layer {}, beyond the last layer {}", s, first,
                  layers - 1);
    }
  }
  Boundaries b = firstLayerOfEachStage;
  b.push_back(layers);
  return b;
}

double PartitionPlan::stageMs(int stage) const {
  double ms = 0;
  for (int i = begin(stage); i < end(stage); ++i) ms += layers.at(i).ms;
  return ms;
}

int64_t PartitionPlan::stageParameters(int stage) const {
  int64_t n = 0;
  for (int i = begin(stage); i < end(stage); ++i) n += layers.at(i).parameters;
  return n;
}

int64_t PartitionPlan::stageActivationBytes(int stage) const {
  int64_t n = 0;
  for (int i = begin(stage); i < end(stage); ++i) n += layers.at(i).activationBytes;
  return n;
}

double PartitionPlan::imbalance() const {
  double total = 0, slowest = 0;
  for (int s = 0; s < stages(); ++s) {
    const double ms = stageMs(s);
    total += ms;
    slowest = std::max(slowest, ms);
  }
  if (total <= 0) return 0;
  return slowest / (total / stages());
}

std::string PartitionPlan::describe() const {
  checkLayerCount(*this);
  std::string out =
      fmt::format("partition by {}: {} layers into {} stages\n", method, layers.size(), stages());
  out += fmt::format("{:>5}  {:<28} {:>12} {:>10} {:>12} {:>12}\n", "stage", "layers", "parameters",
                     "ms", "act kept", "act sent");
  double total = 0;
  int slowest = 0;
  for (int s = 0; s < stages(); ++s) {
    const LayerInfo& first = layers.at(begin(s));
    const LayerInfo& last = layers.at(end(s) - 1);
    const std::string range = end(s) - begin(s) == 1 ? fmt::format("{} [{}]", first.name, begin(s))
                                                     : fmt::format("{}..{} [{}, {})", first.name,
                                                                   last.name, begin(s), end(s));
    out += fmt::format("{:>5}  {:<28} {:>12} {:>10.3f} {:>12} {:>12}\n", s, range,
                       stageParameters(s), stageMs(s), humanBytes(stageActivationBytes(s)),
                       humanBytes(stageOutputBytes(s)));
    total += stageMs(s);
    if (stageMs(s) > stageMs(slowest)) slowest = s;
  }
  if (total <= 0) return out + "(times not measured)\n";
  out += fmt::format(
      "slowest stage {}: {:.3f} ms = {:.3f} x the ideal {:.3f} ms (total {:.3f} / {})\n", slowest,
      stageMs(slowest), imbalance(), total / stages(), total, stages());
  return out;
}

namespace {

PartitionPlan makePlan(std::vector<LayerInfo> layers, Boundaries boundaries, std::string method) {
  PartitionPlan plan;
  plan.boundaries = std::move(boundaries);
  plan.layers = std::move(layers);
  plan.method = std::move(method);
  return plan;
}

}  // namespace

PartitionPlan planByTime(std::vector<LayerInfo> layers, int parts) {
  std::vector<double> cost;
  cost.reserve(layers.size());
  for (const LayerInfo& l : layers) cost.push_back(l.ms);
  Boundaries b = balancedCuts(cost, parts);
  return makePlan(std::move(layers), std::move(b), "time");
}

PartitionPlan planByParameters(std::vector<LayerInfo> layers, int parts) {
  std::vector<int64_t> params;
  params.reserve(layers.size());
  for (const LayerInfo& l : layers) params.push_back(l.parameters);
  Boundaries b = byParameters(params, parts);
  return makePlan(std::move(layers), std::move(b), "parameters");
}

PartitionPlan planFromBoundaries(std::vector<LayerInfo> layers,
                                 const std::vector<int>& firstLayerOfEachStage) {
  Boundaries b = fromBoundaries(firstLayerOfEachStage, static_cast<int>(layers.size()));
  return makePlan(std::move(layers), std::move(b), "manual");
}

}  // namespace shoal::train::pipeline
