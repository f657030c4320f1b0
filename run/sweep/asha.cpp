#include "run/sweep/asha.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace shoal::run::sweep {
namespace {

// The rung index of `epoch`, or -1.
int rungOf(const EarlyStopping& o, int epoch) {
  if (epoch < o.minEpochs || (o.maxEpochs > 0 && epoch >= o.maxEpochs)) return -1;
  int64_t at = o.minEpochs;
  for (int k = 0; at <= epoch; ++k, at *= o.reductionFactor) {
    if (at == epoch) return k;
  }
  return -1;
}

}  // namespace

Asha::Asha(const EarlyStopping& options, Direction direction)
    : options_(options), direction_(direction) {
  SHOAL_CHECK(options.minEpochs >= 1 && options.reductionFactor >= 2,
              "ASHA needs min_epochs >= 1 and reduction_factor >= 2");
}

bool Asha::isRung(int epoch) const {
  return rungOf(options_, epoch) >= 0;
}

const std::vector<double>& Asha::recorded(int epoch) const {
  static const std::vector<double> kNone;
  const int k = rungOf(options_, epoch);
  return k >= 0 && static_cast<size_t>(k) < rungs_.size() ? rungs_[static_cast<size_t>(k)] : kNone;
}

bool Asha::report(int epoch, double value) {
  const int k = rungOf(options_, epoch);
  if (k < 0) return false;
  if (std::isnan(value)) return true;
  if (rungs_.size() <= static_cast<size_t>(k)) rungs_.resize(static_cast<size_t>(k) + 1);
  std::vector<double>& rung = rungs_[static_cast<size_t>(k)];
  rung.push_back(value);
  std::vector<double> sorted = rung;
  std::sort(sorted.begin(), sorted.end(),
            [&](double a, double b) { return isBetter(direction_, a, b); });
  const size_t promoted = sorted.size() / static_cast<size_t>(options_.reductionFactor);
  const double bar = sorted[promoted == 0 ? 0 : promoted - 1];
  return isBetter(direction_, bar, value);  // strictly worse than the bar: stop
}

}  // namespace shoal::run::sweep
