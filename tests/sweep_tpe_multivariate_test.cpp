// Multivariate TPE (run/sweep/tpe_multivariate.h), as pure computation: its joint estimator is
// a density, its suggestions fit the space (log, int and choice dimensions), it is
// deterministic, and on an objective whose optimum lies in a narrow valley across parameters it
// beats univariate TPE (tpe_search.h) over many seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "run/sweep/search_space.h"
#include "run/sweep/tpe_multivariate.h"
#include "run/sweep/tpe_search.h"
#include "tests/sweep_search_util.h"

namespace sw = shoal::run::sweep;

namespace {

sw::SweepConfig configOf(const std::string& params, bool multivariate, uint64_t seed) {
  sw::SweepConfig c = sw::parseSweepConfig(R"({"command": ["train"], "metric": "loss",
      "direction": "min", "parameters": )" +
                                           params + "}");
  c.algorithm = sw::Algorithm::kTpe;
  c.tpe.multivariate = multivariate;
  c.seed = seed;
  return c;
}

using Objective = shoal::test::SweepObjective;
using shoal::test::bestOf;
using shoal::test::median;

// Four parameters of every kind: a real, a log-scaled real, a log-scaled int and a choice.
const std::string kMixed = R"({
    "x": {"type": "uniform", "low": -5, "high": 5},
    "lr": {"type": "log_uniform", "low": 1e-4, "high": 1},
    "width": {"type": "int", "low": 1, "high": 512, "log": true},
    "opt": {"type": "choice", "values": ["sgd", "adam", "lamb"]}})";

}  // namespace

TEST(MultivariateTpe, IsTheDefaultTpeAndCanBeTurnedOff) {
  const auto make = [](const std::string& tpe) {
    return sw::makeSearchAlgorithm(
        sw::parseSweepConfig(R"({"command": ["t"], "metric": "m", "algorithm": "tpe", )" + tpe +
                             R"("parameters": {"x": {"type": "uniform", "low": 0, "high": 1}}})"));
  };
  EXPECT_NE(dynamic_cast<sw::MultivariateTpeSearch*>(make("").get()), nullptr);
  EXPECT_NE(
      dynamic_cast<sw::MultivariateTpeSearch*>(make(R"("tpe": {"multivariate": true}, )").get()),
      nullptr);
  EXPECT_NE(dynamic_cast<sw::TpeSearch*>(make(R"("tpe": {"multivariate": false}, )").get()),
            nullptr);
}

TEST(MultivariateTpe, TheJointEstimatorIsADensityOverTheSpace) {
  // Two reals, a choice and an int: the integral over the reals, summed over the choice's
  // values and the ints, is 1 (midpoint rule on a grid).
  const sw::SweepConfig c = configOf(R"({
      "x": {"type": "uniform", "low": 0, "high": 1},
      "y": {"type": "log_uniform", "low": 0.01, "high": 1},
      "k": {"type": "choice", "values": [1, 2, 3]},
      "n": {"type": "int", "low": 2, "high": 5}})",
                                     true, 0);
  const sw::Assignment a{0.2, 0.05, 1, 3}, b{0.25, 0.5, 2, 5}, d{0.9, 0.02, 1, 2};
  const sw::JointParzenEstimator p(c, {&a, &b, &d});
  EXPECT_EQ(p.components(), 4u);
  const int steps = 200;
  const double ly0 = std::log(0.01), ly1 = std::log(1.0);
  double integral = 0;
  for (int i = 0; i < steps; ++i) {
    const double x = (i + 0.5) / steps;
    for (int j = 0; j < steps; ++j) {
      // Over log y: the density in internal coordinates (search_space.h) integrates to 1 there.
      const double y = std::exp(ly0 + (j + 0.5) / steps * (ly1 - ly0));
      for (double k : {0.0, 1.0, 2.0}) {
        for (double n : {2.0, 3.0, 4.0, 5.0}) {
          integral += std::exp(p.logDensity({x, y, k, n})) * (ly1 - ly0) / (steps * steps);
        }
      }
    }
  }
  EXPECT_NEAR(integral, 1.0, 2e-3);
  // The density is highest where the points are, jointly: near a (x 0.2, y 0.05, k 1, n 3),
  // not at a's x with b's y.
  EXPECT_GT(p.logDensity({0.21, 0.05, 1, 3}), p.logDensity({0.21, 0.5, 1, 3}));
  EXPECT_GT(p.logDensity({0.21, 0.05, 1, 3}), p.logDensity({0.21, 0.05, 2, 3}));
  // With no points only the prior is left, and it is still a density.
  const sw::JointParzenEstimator prior(c, {});
  EXPECT_EQ(prior.components(), 1u);
  EXPECT_TRUE(std::isfinite(prior.logDensity({0.5, 0.1, 2, 4})));
}

TEST(MultivariateTpe, SuggestionsFitTheSpaceAndAreDeterministic) {
  const auto f = [](const sw::Assignment& a) {
    return std::pow(a[0] - 1, 2) + std::pow(std::log10(a[1]) + 2, 2) +
           std::pow(std::log2(a[2]) - 5, 2) / 10 + (a[3] == 1 ? 0 : 1);
  };
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const sw::SweepConfig c = configOf(kMixed, true, seed);
    std::vector<sw::Assignment> first, second;
    const double best = bestOf(c, f, 60, &first);
    EXPECT_EQ(bestOf(c, f, 60, &second), best);
    EXPECT_EQ(first, second);  // the same seed and history: the same suggestions
    std::set<double> choices;
    for (const sw::Assignment& a : first) {
      ASSERT_TRUE(sw::fits(c, a)) << a[0] << " " << a[1] << " " << a[2] << " " << a[3];
      choices.insert(a[3]);
    }
    // After the start-up trials the model settles on the best choice ("adam") most of the time.
    int adam = 0;
    for (size_t k = static_cast<size_t>(c.tpe.startupTrials); k < first.size(); ++k) {
      adam += first[k][3] == 1 ? 1 : 0;
    }
    EXPECT_GT(adam, static_cast<int>(first.size() - c.tpe.startupTrials) / 2) << "seed " << seed;
    // The start-up trials are univariate TPE's, draw for draw.
    std::vector<sw::Assignment> univariate;
    bestOf(configOf(kMixed, false, seed), f, c.tpe.startupTrials, &univariate);
    EXPECT_EQ(std::vector<sw::Assignment>(first.begin(), first.begin() + c.tpe.startupTrials),
              univariate);
  }
  // Another seed, other suggestions.
  std::vector<sw::Assignment> a, b;
  bestOf(configOf(kMixed, true, 1), f, 20, &a);
  bestOf(configOf(kMixed, true, 2), f, 20, &b);
  EXPECT_NE(a, b);
}

// Median best of `trials` trials over `seeds` seeds, multivariate and univariate, and on how many
// seeds multivariate found the better best. Pure computation, a second or so.
struct Race {
  double multivariate, univariate;
  int multivariateWins;
};
Race race(const std::string& space, const Objective& f, int trials, int seeds) {
  std::vector<double> multi, uni;
  int wins = 0;
  for (uint64_t seed = 0; seed < static_cast<uint64_t>(seeds); ++seed) {
    multi.push_back(bestOf(configOf(space, true, seed), f, trials));
    uni.push_back(bestOf(configOf(space, false, seed), f, trials));
    wins += multi.back() < uni.back() ? 1 : 0;
  }
  const Race r{median(multi), median(uni), wins};
  std::printf(
      "median best of %d trials over %d seeds: multivariate %.3g, univariate %.3g; "
      "multivariate better on %d seeds\n",
      trials, seeds, r.multivariate, r.univariate, r.multivariateWins);
  return r;
}

TEST(MultivariateTpe, BeatsUnivariateInANarrowDiagonalValley) {
  // The optimum (u = v = 0.6) lies at the bottom of a valley along the diagonal of (x, log10 lr),
  // both scaled to [0, 1]: 0.1 off the diagonal costs as much as the whole length of the valley.
  // Good trials spread along it, so univariate TPE, choosing x and lr apart, pairs one good
  // trial's x with another's lr and leaves the valley; multivariate TPE keeps each good trial's
  // pair. (Measured when this was written, over five sets of 101 seeds: multivariate's median
  // 4 to 12 times lower, better on 68 to 78 seeds of 101.)
  const auto f = [](const sw::Assignment& a) {
    const double u = (a[0] + 5) / 10;             // x in [0, 1]
    const double v = (std::log10(a[1]) + 4) / 4;  // log10 lr in [0, 1]
    return 100 * (u - v) * (u - v) + (u + v - 1.2) * (u + v - 1.2);
  };
  const Race r = race(R"({
      "x": {"type": "uniform", "low": -5, "high": 5},
      "lr": {"type": "log_uniform", "low": 1e-4, "high": 1}})",
                      f, 100, 101);
  EXPECT_LT(r.multivariate, 0.4 * r.univariate);
  EXPECT_GE(r.multivariateWins, 60);
}

TEST(MultivariateTpe, KeepsTheCoordinatesOfOneBasinTogether) {
  // Two equally good basins in 4-D, at (0.2, 0.2, 0.2, 0.2) and (0.8, 0.8, 0.8, 0.8): the good
  // trials fall in both, and univariate TPE mixes their coordinates ((0.2, 0.8, ...) is in
  // neither). (Measured: multivariate's median about 5 times lower, better on 85 to 90 seeds of
  // 101, over five sets of seeds.)
  const auto f = [](const sw::Assignment& a) {
    double near = 0, far = 0;
    for (double x : a) {
      near += (x - 0.2) * (x - 0.2);
      far += (x - 0.8) * (x - 0.8);
    }
    return std::min(near, far);
  };
  const Race r = race(R"({
      "a": {"type": "uniform", "low": 0, "high": 1}, "b": {"type": "uniform", "low": 0, "high": 1},
      "c": {"type": "uniform", "low": 0, "high": 1}, "d": {"type": "uniform", "low": 0, "high": 1}})",
                      f, 60, 101);
  EXPECT_LT(r.multivariate, 0.4 * r.univariate);
  EXPECT_GE(r.multivariateWins, 70);
}

TEST(MultivariateTpe, StaysAwayFromWhereTrialsFail) {
  // As TpeSearch.StaysAwayFromWhereTrialsFail: failed trials rank last, so g covers the region
  // where trials fail (x > 2.5, a quarter of the range, next to the optimum at 1.7).
  int failedAfterStartup = 0, afterStartup = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const sw::SweepConfig c = configOf(R"({"x": {"type": "uniform", "low": -5, "high": 5},
                     "y": {"type": "uniform", "low": -5, "high": 5}})",
                                       true, seed);
    sw::MultivariateTpeSearch search(c);
    std::vector<sw::Observation> history;
    for (int k = 0; k < 40; ++k) {
      const sw::Assignment a = *search.suggest(k, history);
      const bool fails = a[0] > 2.5;
      if (k >= c.tpe.startupTrials) {
        ++afterStartup;
        failedAfterStartup += fails ? 1 : 0;
      }
      const double v = (a[0] - 1.7) * (a[0] - 1.7) + a[1] * a[1];
      history.push_back(fails ? sw::Observation{a, NAN, 0, false, true}
                              : sw::Observation{a, v, 1, true, false});
    }
  }
  std::printf("multivariate TPE suggestions in the failing region: %d of %d\n", failedAfterStartup,
              afterStartup);
  EXPECT_LT(failedAfterStartup, afterStartup / 2);
}
