#include "train/pipeline/split_advice.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace shoal::train::pipeline {

namespace {

bool validCost(double v) {
  return std::isfinite(v) && v >= 0;
}

}  // namespace

SplitAdvice adviseSplit(const std::vector<double>& layerMs, const Boundaries& current,
                        const std::vector<double>& measuredMs) {
  const int layers = static_cast<int>(layerMs.size());
  const int stages = static_cast<int>(measuredMs.size());
  SHOAL_CHECK(stages >= 1 && current.size() == measuredMs.size() + 1,
              "split advice: {} measurements for a split of {} boundaries", stages, current.size());
  SHOAL_CHECK(current.front() == 0 && current.back() == layers &&
                  std::is_sorted(current.begin(), current.end()) &&
                  std::adjacent_find(current.begin(), current.end()) == current.end(),
              "split advice: boundaries {} are not a split of {} layers", current, layers);
  SHOAL_CHECK(std::all_of(layerMs.begin(), layerMs.end(), validCost) &&
                  std::all_of(measuredMs.begin(), measuredMs.end(), validCost),
              "split advice: costs and measurements must be finite and >= 0");
  // Each stage's measured time spread over its layers as the profile weighs them.
  std::vector<double> cost(layerMs.size());
  for (int s = 0; s < stages; ++s) {
    const int begin = current[s], end = current[s + 1];
    const double profiled = std::accumulate(layerMs.begin() + begin, layerMs.begin() + end, 0.0);
    for (int l = begin; l < end; ++l) {
      cost[l] = profiled > 0 ? measuredMs[s] * layerMs[l] / profiled
                             : measuredMs[s] / static_cast<double>(end - begin);
    }
  }
  SplitAdvice a;
  a.measuredMs = measuredMs;
  a.current = current;
  a.currentSlowestMs = *std::max_element(measuredMs.begin(), measuredMs.end());
  a.suggested = balancedCuts(cost, stages);
  for (int s = 0; s < stages; ++s) {
    a.suggestedSlowestMs = std::max(
        a.suggestedSlowestMs,
        std::accumulate(cost.begin() + a.suggested[s], cost.begin() + a.suggested[s + 1], 0.0));
  }
  if (!a.better()) {
    a.suggested = current;
    a.suggestedSlowestMs = a.currentSlowestMs;
  }
  return a;
}

std::string SplitAdvice::describe() const {
  const auto slowest = std::max_element(measuredMs.begin(), measuredMs.end());
  const double mean = std::accumulate(measuredMs.begin(), measuredMs.end(), 0.0) /
                      static_cast<double>(measuredMs.size());
  std::string text = fmt::format(
      "pipeline stages measured {:.2f} ms per step (slowest: stage {}, {:.2f} x the mean)",
      fmt::join(measuredMs, ", "), slowest - measuredMs.begin(), mean > 0 ? *slowest / mean : 1.0);
  if (!better()) return text + "; the split is as good as any for these times\n";
  const std::vector<int> firsts(suggested.begin() + 1, suggested.end() - 1);
  return text + fmt::format(
                    "; a split at layers {} would make the slowest about {:.2f} ms: "
                    "PipelineOptions::boundaries = {{{}}} with split kBoundaries\n",
                    fmt::join(suggested, ", "), suggestedSlowestMs, fmt::join(firsts, ", "));
}

}  // namespace shoal::train::pipeline
