#include "run/sweep/random_search.h"

namespace shoal::run::sweep {

Assignment sampleUniform(const SweepConfig& config, SweepRandom& random) {
  Assignment a;
  for (const Parameter& p : config.parameters) {
    if (p.kind == ParamKind::kChoice) {
      a.push_back(static_cast<double>(random.below(p.choices.size())));
      continue;
    }
    const auto [low, high] = internalRange(p);
    a.push_back(fromInternal(p, random.uniform(low, high)));
  }
  return a;
}

std::optional<Assignment> RandomSearch::suggest(int trial, const std::vector<Observation>&) {
  SweepRandom random(config_.seed, static_cast<uint64_t>(trial), /*purpose=*/1);
  return sampleUniform(config_, random);
}

}  // namespace shoal::run::sweep
