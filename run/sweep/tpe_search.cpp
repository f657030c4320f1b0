#include "run/sweep/tpe_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "run/sweep/random_search.h"

namespace shoal::run::sweep {
namespace {

constexpr size_t kMaxGood = 25;
constexpr int kMaxRejections = 64;

double normalCdf(double z) {
  return 0.5 * std::erfc(-z / std::numbers::sqrt2);
}

// Smoothed category probabilities from the observed indices.
std::vector<double> categoryWeights(const std::vector<double>& indices, size_t k) {
  std::vector<double> w(k, 1.0);
  for (double i : indices) w[static_cast<size_t>(i)] += 1.0;
  const double total = static_cast<double>(indices.size() + k);
  for (double& x : w) x /= total;
  return w;
}

// True when trial a ranks before trial b (see the header, step 2).
bool ranksBefore(Direction d, const Observation& a, const Observation& b) {
  if (a.failed != b.failed) return b.failed;
  if (a.complete != b.complete) return a.complete;
  if (!a.complete && a.epochs != b.epochs) return a.epochs > b.epochs;
  return isBetter(d, a.value, b.value);
}

// A parameter's value in the samplers' coordinates: the internal one (search_space.h) for a
// number, the index for a choice.
double samplerCoordinate(const Parameter& p, double value) {
  return p.kind == ParamKind::kChoice ? value : toInternal(p, value);
}

}  // namespace

ParzenEstimator::ParzenEstimator(const std::vector<double>& points, double low, double high)
    : low_(low), high_(high) {
  const double range = high - low;
  // The observations and the prior, sorted, so neighbours are adjacent.
  std::vector<std::pair<double, bool>> mus;  // (centre, is the prior)
  for (double x : points) mus.emplace_back(x, false);
  mus.emplace_back(0.5 * (low + high), true);
  std::sort(mus.begin(), mus.end());
  const double minSigma = range / std::min(100.0, static_cast<double>(mus.size()) + 1.0);
  for (size_t i = 0; i < mus.size(); ++i) {
    const double mu = mus[i].first;
    const double left = mu - (i == 0 ? low : mus[i - 1].first);
    const double right = (i + 1 == mus.size() ? high : mus[i + 1].first) - mu;
    // The prior stays broad whatever its neighbours: every region keeps some density.
    const double sigma = mus[i].second ? range : std::clamp(std::max(left, right), minSigma, range);
    mus_.push_back(mu);
    sigmas_.push_back(sigma);
    const double mass = normalCdf((high - mu) / sigma) - normalCdf((low - mu) / sigma);
    logNorms_.push_back(std::log(std::max(mass, 1e-300)));
  }
}

double ParzenEstimator::sample(SweepRandom& random) const {
  const size_t k = random.below(mus_.size());  // equal weights
  for (int attempt = 0; attempt < kMaxRejections; ++attempt) {
    const double x = mus_[k] + sigmas_[k] * random.normal();
    if (x >= low_ && x <= high_) return x;
  }
  return random.uniform(low_, high_);  // a component almost wholly outside: rare
}

double ParzenEstimator::logDensity(double x) const {
  // log-sum-exp over the components, each a truncated normal density with weight 1/n.
  std::vector<double> terms;
  double top = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < mus_.size(); ++i) {
    const double z = (x - mus_[i]) / sigmas_[i];
    const double t =
        -0.5 * z * z - std::log(sigmas_[i] * std::sqrt(2 * std::numbers::pi)) - logNorms_[i];
    terms.push_back(t);
    top = std::max(top, t);
  }
  double sum = 0;
  for (double t : terms) sum += std::exp(t - top);
  return top + std::log(sum) - std::log(static_cast<double>(mus_.size()));
}

TpeSplit splitHistory(const SweepConfig& config, const std::vector<Observation>& history) {
  std::vector<const Observation*> ranked;
  for (const Observation& o : history) ranked.push_back(&o);
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Observation* a, const Observation* b) {
    return ranksBefore(config.direction, *a, *b);
  });
  const size_t nGood = std::clamp<size_t>(
      static_cast<size_t>(std::ceil(config.tpe.gamma * static_cast<double>(ranked.size()))), 1,
      std::min(kMaxGood, ranked.size()));
  TpeSplit split;
  split.good.assign(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(nGood));
  split.bad.assign(ranked.begin() + static_cast<std::ptrdiff_t>(nGood), ranked.end());
  return split;
}

std::optional<Assignment> TpeSearch::suggest(int trial, const std::vector<Observation>& history) {
  SweepRandom random(config_.seed, static_cast<uint64_t>(trial), /*purpose=*/2);
  if (history.size() < static_cast<size_t>(config_.tpe.startupTrials)) {
    return sampleUniform(config_, random);
  }
  const TpeSplit split = splitHistory(config_, history);

  // The densities factorise over parameters, so the best of the candidates is chosen for each
  // parameter on its own (as Hyperopt and Optuna's independent sampler do): a joint choice
  // among whole candidates would let the numeric terms drown a categorical one.
  Assignment out;
  for (size_t j = 0; j < config_.parameters.size(); ++j) {
    const Parameter& p = config_.parameters[j];
    std::vector<double> good, bad;
    for (const Observation* o : split.good) good.push_back(samplerCoordinate(p, o->params[j]));
    for (const Observation* o : split.bad) bad.push_back(samplerCoordinate(p, o->params[j]));
    double bestValue = 0, bestScore = -std::numeric_limits<double>::infinity();
    if (p.kind == ParamKind::kChoice) {
      const std::vector<double> l = categoryWeights(good, p.choices.size());
      const std::vector<double> g = categoryWeights(bad, p.choices.size());
      for (int c = 0; c < config_.tpe.candidates; ++c) {
        // Inverse-CDF draw from l.
        double u = random.uniform();
        size_t pick = 0;
        while (pick + 1 < l.size() && u >= l[pick]) u -= l[pick++];
        const double score = std::log(l[pick]) - std::log(g[pick]);
        if (score > bestScore) {
          bestScore = score;
          bestValue = static_cast<double>(pick);
        }
      }
    } else {
      const auto [low, high] = internalRange(p);
      const ParzenEstimator l(good, low, high), g(bad, low, high);
      for (int c = 0; c < config_.tpe.candidates; ++c) {
        const double value = fromInternal(p, l.sample(random));
        const double x = toInternal(p, value);  // ints scored where they are rounded to
        const double score = l.logDensity(x) - g.logDensity(x);
        if (score > bestScore) {
          bestScore = score;
          bestValue = value;
        }
      }
    }
    out.push_back(bestValue);
  }
  return out;
}

}  // namespace shoal::run::sweep
