#include "run/sweep/tpe_multivariate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "run/sweep/random_search.h"
#include "run/sweep/tpe_search.h"

namespace shoal::run::sweep {
namespace {

// A lone point's width, as a fraction of the range (BOHB's and Optuna's Scott factor).
constexpr double kLoneWidth = 0.2;
// The narrowest width, as a fraction of range / min(100, n + 1) (Optuna's "magic clip" is 1).
constexpr double kMinWidth = 0.5;
constexpr int kMaxRejections = 64;

// The mass of a standard normal over [zLow, zHigh], accurate in either tail (the difference of
// two upper tails, or of two lower ones, rather than of two numbers close to 1).
double normalMass(double zLow, double zHigh) {
  const auto upper = [](double z) { return 0.5 * std::erfc(z / std::numbers::sqrt2); };
  if (zLow >= 0) return upper(zLow) - upper(zHigh);
  if (zHigh <= 0) return upper(-zHigh) - upper(-zLow);
  return 1 - upper(zHigh) - upper(-zLow);
}

double logNormalDensity(double x, double mu, double sigma) {
  const double z = (x - mu) / sigma;
  return -0.5 * z * z - std::log(sigma * std::sqrt(2 * std::numbers::pi));
}

}  // namespace

JointParzenEstimator::JointParzenEstimator(const SweepConfig& config,
                                           const std::vector<const Assignment*>& points) {
  const size_t n = points.size();
  const size_t components = n + 1;  // the last is the prior
  weights_.assign(components, 1.0 / static_cast<double>(components));
  const double d = static_cast<double>(config.parameters.size());
  const double scott = std::pow(static_cast<double>(std::max<size_t>(n, 1)), -1.0 / (d + 4));
  for (size_t j = 0; j < config.parameters.size(); ++j) {
    const Parameter& p = config.parameters[j];
    Dimension dim;
    dim.parameter = &p;
    if (p.kind == ParamKind::kChoice) {
      const size_t k = p.choices.size();
      const double a = 1.0 / static_cast<double>(components);
      for (const Assignment* point : points) {
        std::vector<double> w(k, a / (1 + static_cast<double>(k) * a));
        w[static_cast<size_t>((*point)[j])] += 1 / (1 + static_cast<double>(k) * a);
        dim.weights.push_back(std::move(w));
      }
      dim.weights.emplace_back(k, 1.0 / static_cast<double>(k));
    } else {
      const auto [low, high] = internalRange(p);
      const double range = high - low;
      dim.low = low;
      dim.high = high;
      for (const Assignment* point : points) dim.mus.push_back(toInternal(p, (*point)[j]));
      // Note [Joint bandwidth]: Scott's rule over the points' own spread.
      double spread = kLoneWidth * range;
      if (n >= 2) {
        double mean = 0, squares = 0;
        for (size_t i = 0; i < n; ++i) mean += dim.mus[i] / static_cast<double>(n);
        for (size_t i = 0; i < n; ++i) squares += (dim.mus[i] - mean) * (dim.mus[i] - mean);
        spread = std::sqrt(squares / static_cast<double>(n - 1));
      }
      const double minSigma = kMinWidth * range / std::min(100.0, static_cast<double>(n) + 1.0);
      dim.sigmas.assign(n, std::clamp(spread * scott, minSigma, range));
      dim.mus.push_back(0.5 * (low + high));
      dim.sigmas.push_back(range);
      for (size_t c = 0; c < components; ++c) {
        const double mass =
            normalMass((low - dim.mus[c]) / dim.sigmas[c], (high - dim.mus[c]) / dim.sigmas[c]);
        dim.logNorms.push_back(std::log(std::max(mass, 1e-300)));
      }
    }
    dims_.push_back(std::move(dim));
  }
}

double JointParzenEstimator::logKernel(const Dimension& d, size_t c, double value) const {
  const Parameter& p = *d.parameter;
  if (p.kind == ParamKind::kChoice) return std::log(d.weights[c][static_cast<size_t>(value)]);
  const double mu = d.mus[c], sigma = d.sigmas[c];
  if (p.kind != ParamKind::kInt) {
    return logNormalDensity(toInternal(p, value), mu, sigma) - d.logNorms[c];
  }
  // An integer's cell, in internal coordinates (the range is widened by the same half step).
  const double lo = std::max(d.low, toInternal(p, value - 0.5));
  const double hi = std::min(d.high, toInternal(p, value + 0.5));
  const double mass = normalMass((lo - mu) / sigma, (hi - mu) / sigma);
  if (mass > 1e-250) return std::log(mass) - d.logNorms[c];
  // Far in a tail: the density at the integer times the cell's width, near enough.
  return logNormalDensity(toInternal(p, value), mu, sigma) + std::log(hi - lo) - d.logNorms[c];
}

Assignment JointParzenEstimator::sample(SweepRandom& random) const {
  const size_t c = random.below(weights_.size());  // equal weights
  Assignment a;
  for (const Dimension& d : dims_) {
    const Parameter& p = *d.parameter;
    if (p.kind == ParamKind::kChoice) {
      double u = random.uniform();
      size_t pick = 0;
      while (pick + 1 < d.weights[c].size() && u >= d.weights[c][pick]) u -= d.weights[c][pick++];
      a.push_back(static_cast<double>(pick));
      continue;
    }
    double x = std::numeric_limits<double>::quiet_NaN();
    for (int attempt = 0; attempt < kMaxRejections && std::isnan(x); ++attempt) {
      const double y = d.mus[c] + d.sigmas[c] * random.normal();
      if (y >= d.low && y <= d.high) x = y;
    }
    if (std::isnan(x)) x = random.uniform(d.low, d.high);  // a component mostly outside: rare
    a.push_back(fromInternal(p, x));
  }
  return a;
}

double JointParzenEstimator::logDensity(const Assignment& a) const {
  // log-sum-exp over the components of log w_c + sum over dimensions of log kernel.
  std::vector<double> terms(weights_.size());
  double top = -std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < weights_.size(); ++c) {
    double t = std::log(weights_[c]);
    for (size_t j = 0; j < dims_.size(); ++j) t += logKernel(dims_[j], c, a[j]);
    terms[c] = t;
    top = std::max(top, t);
  }
  double sum = 0;
  for (double t : terms) sum += std::exp(t - top);
  return top + std::log(sum);
}

std::optional<Assignment> MultivariateTpeSearch::suggest(int trial,
                                                         const std::vector<Observation>& history) {
  // The generator and start-up draws of univariate TPE: with one seed both variants start from
  // the same trials.
  SweepRandom random(config_.seed, static_cast<uint64_t>(trial), /*purpose=*/2);
  if (history.size() < static_cast<size_t>(config_.tpe.startupTrials)) {
    return sampleUniform(config_, random);
  }
  const TpeSplit split = splitHistory(config_, history);
  std::vector<const Assignment*> good, bad;
  for (const Observation* o : split.good) good.push_back(&o->params);
  for (const Observation* o : split.bad) bad.push_back(&o->params);
  const JointParzenEstimator l(config_, good), g(config_, bad);
  Assignment best;
  double bestScore = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < config_.tpe.candidates; ++c) {
    Assignment a = l.sample(random);
    const double score = l.logDensity(a) - g.logDensity(a);
    if (best.empty() || score > bestScore) {
      bestScore = score;
      best = std::move(a);
    }
  }
  return best;
}

}  // namespace shoal::run::sweep
