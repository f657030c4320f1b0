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

double largest(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

}  // namespace

std::vector<double> rankLoads(const std::vector<double>& perVirtualStage, int chunks) {
  const size_t ranks = perVirtualStage.size() / static_cast<size_t>(chunks);
  std::vector<double> load(ranks, 0.0);
  for (size_t v = 0; v < perVirtualStage.size(); ++v) load[v % ranks] += perVirtualStage[v];
  return load;
}

SplitAdvice adviseSplit(const std::vector<double>& layerMs, const Boundaries& current,
                        const std::vector<double>& measuredMs, int chunks) {
  const int layers = static_cast<int>(layerMs.size());
  const int stages = static_cast<int>(measuredMs.size());
  SHOAL_CHECK(stages >= 1 && current.size() == measuredMs.size() + 1,
              "split advice: {} measurements for a split of {} boundaries", stages, current.size());
  SHOAL_CHECK(chunks >= 1 && stages % chunks == 0,
              "split advice: {} virtual stages are not {} chunks per rank", stages, chunks);
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
  a.chunks = chunks;
  a.current = current;
  a.currentSlowestMs = largest(rankLoads(measuredMs, chunks));
  // Balancing every virtual stage balances the ranks' sums of them too.
  a.suggested = balancedCuts(cost, stages);
  std::vector<double> estimated(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    estimated[static_cast<size_t>(s)] =
        std::accumulate(cost.begin() + a.suggested[s], cost.begin() + a.suggested[s + 1], 0.0);
  }
  a.suggestedSlowestMs = largest(rankLoads(estimated, chunks));
  if (!a.better()) {
    a.suggested = current;
    a.suggestedSlowestMs = a.currentSlowestMs;
  }
  return a;
}

std::string SplitAdvice::describe() const {
  const std::vector<double> loads = rankLoads(measuredMs, chunks);
  const auto slowest = std::max_element(loads.begin(), loads.end());
  const double mean =
      std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
  const double ratio = mean > 0 ? *slowest / mean : 1.0;
  std::string text =
      chunks == 1
          ? fmt::format(
                "pipeline stages measured {:.2f} ms per step (slowest: stage {}, {:.2f} x the "
                "mean)",
                fmt::join(measuredMs, ", "), slowest - loads.begin(), ratio)
          : fmt::format(
                "pipeline virtual stages measured {:.2f} ms per step, {} chunks per rank: ranks "
                "{:.2f} ms (slowest: rank {}, {:.2f} x the mean)",
                fmt::join(measuredMs, ", "), chunks, fmt::join(loads, ", "),
                slowest - loads.begin(), ratio);
  if (!better()) return text + "; the split is as good as any for these times\n";
  const std::vector<int> firsts(suggested.begin() + 1, suggested.end() - 1);
  return text + fmt::format(
                    "; a split at layers {} would make the slowest about {:.2f} ms: "
                    "PipelineOptions::boundaries = {{{}}} with split kBoundaries\n",
                    fmt::join(suggested, ", "), suggestedSlowestMs, fmt::join(firsts, ", "));
}

}  // namespace shoal::train::pipeline
