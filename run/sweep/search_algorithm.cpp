#include "run/sweep/search_algorithm.h"

#include "run/sweep/grid_search.h"
#include "run/sweep/random_search.h"
#include "run/sweep/tpe_multivariate.h"
#include "run/sweep/tpe_search.h"

namespace shoal::run::sweep {

std::unique_ptr<SearchAlgorithm> makeSearchAlgorithm(const SweepConfig& config) {
  switch (config.algorithm) {
    case Algorithm::kGrid:
      return std::make_unique<GridSearch>(config);
    case Algorithm::kRandom:
      return std::make_unique<RandomSearch>(config);
    case Algorithm::kTpe:
      if (config.tpe.multivariate) return std::make_unique<MultivariateTpeSearch>(config);
      return std::make_unique<TpeSearch>(config);
  }
  return nullptr;
}

}  // namespace shoal::run::sweep
