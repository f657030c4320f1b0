// The layer-wise optimizers (train/optim/lamb.h, lars.h): their formulas against a reference
// written in double, 1-D exclusion and weight decay in closed form, and the same result when the
// layers are split mid-layer over two flat tensors per shard and two shards (threads exchanging
// their partial norms) as when one optimizer holds the whole layers. Also the names wired into
// makeOptimizer, and the parameter server rejecting them.
#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <cmath>
#include <thread>

#include "common/error.h"
#include "ps/config.h"
#include "train/optim.h"
#include "train/optim/lamb.h"
#include "train/optim/lars.h"

namespace shoal::test {
namespace {

using train::LayerMap;
using train::LayerSegment;

// A small two-layer net's parameters: weights and biases.
const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {7}, {3, 7}, {3}};

std::vector<torch::Tensor> makeParams(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (const auto& s : kShapes) out.push_back(torch::randn(s).requires_grad_());
  return out;
}

// Gradients for `steps` steps, one per parameter per step.
std::vector<std::vector<torch::Tensor>> makeGrads(const std::vector<torch::Tensor>& params,
                                                  int steps, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<std::vector<torch::Tensor>> out(steps);
  for (auto& step : out) {
    for (const auto& p : params) step.push_back(torch::randn_like(p) * 0.1);
  }
  return out;
}

std::vector<torch::Tensor> cloneParams(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

void setGrads(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
}

void expectClose(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), 1e-5, 1e-7))
      << what << ": max difference "
      << (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
}

struct Hyper {
  double lr;
  double weightDecay;
  bool excludeOneDim;
};

// LAMB as the paper writes it, in double, one whole tensor per layer.
std::vector<torch::Tensor> referenceLamb(const std::vector<torch::Tensor>& initial,
                                         const std::vector<std::vector<torch::Tensor>>& grads,
                                         const Hyper& h) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-6;
  std::vector<torch::Tensor> w, m, v;
  for (const auto& p : initial) {
    w.push_back(p.detach().to(torch::kDouble));
    m.push_back(torch::zeros_like(w.back()));
    v.push_back(torch::zeros_like(w.back()));
  }
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (size_t i = 0; i < w.size(); ++i) {
      const auto g = grads[t - 1][i].to(torch::kDouble);
      const bool excluded = h.excludeOneDim && w[i].dim() == 1;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const auto mHat = m[i] / (1 - std::pow(b1, t));
      const auto vHat = v[i] / (1 - std::pow(b2, t));
      const auto u = mHat / (vHat.sqrt() + eps) + (excluded ? 0.0 : h.weightDecay) * w[i];
      const double wNorm = w[i].norm().item<double>(), uNorm = u.norm().item<double>();
      const double ratio = excluded || wNorm == 0 || uNorm == 0 ? 1.0 : wNorm / uNorm;
      w[i] = w[i] - h.lr * ratio * u;
    }
  }
  return w;
}

// LARS as the paper writes it, in double.
std::vector<torch::Tensor> referenceLars(const std::vector<torch::Tensor>& initial,
                                         const std::vector<std::vector<torch::Tensor>>& grads,
                                         const Hyper& h, double momentum, double eta) {
  std::vector<torch::Tensor> w, v;
  for (const auto& p : initial) {
    w.push_back(p.detach().to(torch::kDouble));
    v.push_back(torch::zeros_like(w.back()));
  }
  for (const auto& step : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      const auto g = step[i].to(torch::kDouble);
      const bool excluded = h.excludeOneDim && w[i].dim() == 1;
      const double wd = excluded ? 0.0 : h.weightDecay;
      const double wNorm = w[i].norm().item<double>(), gNorm = g.norm().item<double>();
      const double local =
          excluded || wNorm == 0 || gNorm == 0 ? 1.0 : eta * wNorm / (gNorm + wd * wNorm);
      v[i] = momentum * v[i] + h.lr * local * (g + wd * w[i]);
      w[i] = w[i] - v[i];
    }
  }
  return w;
}

TEST(LayerwiseOptimizer, LambMatchesReference) {
  for (const Hyper h : {Hyper{0.01, 0, true}, Hyper{0.01, 0.1, true}, Hyper{0.02, 0.05, false}}) {
    auto params = makeParams(1);
    const auto initial = cloneParams(params);
    const auto grads = makeGrads(params, 3, 2);
    train::Lamb opt(
        params,
        train::LambOptions(h.lr).weight_decay(h.weightDecay).exclude_one_dim(h.excludeOneDim));
    for (const auto& g : grads) {
      setGrads(params, g);
      opt.step();
    }
    const auto want = referenceLamb(initial, grads, h);
    for (size_t i = 0; i < params.size(); ++i) {
      expectClose(params[i], want[i],
                  fmt::format("lamb wd {} exclude {} param {}", h.weightDecay, h.excludeOneDim, i));
    }
  }
}

TEST(LayerwiseOptimizer, LarsMatchesReference) {
  for (const Hyper h : {Hyper{1.0, 0, true}, Hyper{1.0, 0.01, true}, Hyper{0.5, 0.01, false}}) {
    auto params = makeParams(3);
    const auto initial = cloneParams(params);
    const auto grads = makeGrads(params, 3, 4);
    train::Lars opt(
        params,
        train::LarsOptions(h.lr).weight_decay(h.weightDecay).exclude_one_dim(h.excludeOneDim));
    for (const auto& g : grads) {
      setGrads(params, g);
      opt.step();
    }
    const auto want = referenceLars(initial, grads, h, 0.9, 0.001);
    for (size_t i = 0; i < params.size(); ++i) {
      expectClose(params[i], want[i],
                  fmt::format("lars wd {} exclude {} param {}", h.weightDecay, h.excludeOneDim, i));
    }
  }
}

// The trust ratio in closed form: LAMB's first step moves a 2-D layer by exactly lr ||w|| (the
// ratio rescales the update to the weights' norm), and an excluded 1-D layer by lr u, u being
// Adam's first direction g / (|g| + eps).
TEST(LayerwiseOptimizer, LambFirstStepMovesLayerByLrTimesWeightNorm) {
  auto params = makeParams(5);
  const auto before = cloneParams(params);
  const auto grads = makeGrads(params, 1, 6);
  const double lr = 0.01;
  train::Lamb opt(params, train::LambOptions(lr));
  setGrads(params, grads[0]);
  opt.step();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto delta = (params[i] - before[i]).detach().to(torch::kDouble);
    if (params[i].dim() == 2) {
      EXPECT_NEAR(delta.norm().item<double>(), lr * before[i].norm().item<double>(), 1e-6);
    } else {
      const auto g = grads[0][i].to(torch::kDouble);
      expectClose(delta, -lr * g / (g.abs() + 1e-6), fmt::format("excluded bias {}", i));
    }
  }
}

// Weight decay in closed form, with zero gradients: LAMB's update is wd w with ratio 1/wd, so a
// 2-D layer shrinks by (1 - lr); LARS's local rate is 1, so it shrinks by (1 - lr wd). Excluded
// 1-D layers get no decay and stay; without the exclusion they decay too.
TEST(LayerwiseOptimizer, WeightDecayWithZeroGradients) {
  const double lr = 0.1, wd = 0.01;
  for (const bool exclude : {true, false}) {
    auto lambParams = makeParams(7);
    auto larsParams = cloneParams(lambParams);
    const auto before = cloneParams(lambParams);
    train::Lamb lamb(lambParams, train::LambOptions(lr).weight_decay(wd).exclude_one_dim(exclude));
    train::Lars lars(larsParams, train::LarsOptions(lr).weight_decay(wd).exclude_one_dim(exclude));
    for (auto& p : lambParams) p.mutable_grad() = torch::zeros_like(p);
    for (auto& p : larsParams) p.mutable_grad() = torch::zeros_like(p);
    lamb.step();
    lars.step();
    for (size_t i = 0; i < before.size(); ++i) {
      const bool decays = before[i].dim() == 2 || !exclude;
      expectClose(lambParams[i], decays ? before[i] * (1 - lr) : before[i],
                  fmt::format("lamb exclude {} param {}", exclude, i));
      expectClose(larsParams[i], decays ? before[i] * (1 - lr * wd) : before[i],
                  fmt::format("lars exclude {} param {}", exclude, i));
    }
  }
}

// Two shards, each with two flat tensors cut mid-layer from the concatenated parameters.
struct Shard {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of the flat parameters
  std::vector<torch::Tensor> tensors;
  LayerMap map;
};

Shard makeShard(std::vector<std::pair<int64_t, int64_t>> ranges, const torch::Tensor& flat) {
  Shard s;
  s.ranges = std::move(ranges);
  std::vector<int64_t> layerStart = {0};
  for (const auto& shape : kShapes) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    layerStart.push_back(layerStart.back() + n);
  }
  for (size_t t = 0; t < s.ranges.size(); ++t) {
    const auto [begin, end] = s.ranges[t];
    s.tensors.push_back(flat.slice(0, begin, end).clone().requires_grad_());
    for (size_t l = 0; l < kShapes.size(); ++l) {
      const int64_t lo = std::max(begin, layerStart[l]), hi = std::min(end, layerStart[l + 1]);
      if (lo < hi) s.map.segments.push_back(LayerSegment{t, lo - begin, hi - lo, l});
    }
  }
  for (const auto& shape : kShapes) s.map.oneDim.push_back(shape.size() == 1);
  return s;
}

torch::Tensor flatten(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
  return torch::cat(flat);
}

using Factory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, LayerMap)>;

void expectShardedMatchesWhole(const Factory& make, const std::string& what) {
  auto params = makeParams(11);
  const auto grads = makeGrads(params, 4, 12);
  const auto flat = flatten(params);
  std::array<Shard, 2> shards = {makeShard({{0, 20}, {40, 50}}, flat),
                                 makeShard({{20, 40}, {50, 66}}, flat)};

  // Both shards sum their partial vectors in the same order, so they agree bit for bit.
  std::barrier<> meet(2);
  std::array<std::vector<double>, 2> posted;
  std::array<int, 2> calls = {0, 0};
  for (int me = 0; me < 2; ++me) {
    shards[me].map.sumAcrossShards = [&, me](std::vector<double>& sums) {
      ++calls[me];
      posted[me] = sums;
      meet.arrive_and_wait();
      ASSERT_EQ(posted[0].size(), posted[1].size());
      for (size_t i = 0; i < sums.size(); ++i) sums[i] = posted[0][i] + posted[1][i];
      meet.arrive_and_wait();  // nobody posts the next step's sums before both have read
    };
  }
  auto whole = make(params, LayerMap{});
  for (const auto& g : grads) {
    setGrads(params, g);
    whole->step();
  }

  std::vector<std::thread> threads;
  for (int me = 0; me < 2; ++me) {
    threads.emplace_back([&, me] {
      auto& s = shards[me];
      auto opt = make(s.tensors, s.map);
      for (const auto& g : grads) {
        const auto flatGrad = flatten(g);
        for (size_t t = 0; t < s.tensors.size(); ++t) {
          const auto [begin, end] = s.ranges[t];
          s.tensors[t].mutable_grad() = flatGrad.slice(0, begin, end).clone();
        }
        opt->step();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls[0], static_cast<int>(grads.size()));
  EXPECT_EQ(calls[1], static_cast<int>(grads.size()));

  const auto sharded = torch::cat({shards[0].tensors[0], shards[1].tensors[0], shards[0].tensors[1],
                                   shards[1].tensors[1]})
                           .detach();
  const auto want = flatten(params);
  expectClose(sharded, want, what);
  // And the step did something: the comparison is not between two unchanged copies.
  EXPECT_FALSE(torch::allclose(want, flat, 1e-3, 1e-5)) << what;
}

TEST(LayerwiseOptimizer, LambShardedMatchesWhole) {
  expectShardedMatchesWhole(
      [](std::vector<torch::Tensor> p, LayerMap m) {
        return std::make_unique<train::Lamb>(
            std::move(p), train::LambOptions(0.01).weight_decay(0.01), std::move(m));
      },
      "lamb");
}

TEST(LayerwiseOptimizer, LarsShardedMatchesWhole) {
  expectShardedMatchesWhole(
      [](std::vector<torch::Tensor> p, LayerMap m) {
        return std::make_unique<train::Lars>(
            std::move(p), train::LarsOptions(1.0).weight_decay(0.01), std::move(m));
      },
      "lars");
}

TEST(LayerwiseOptimizer, MakeOptimizerWithLayerMap) {
  auto params = makeParams(13);
  const auto grads = makeGrads(params, 2, 14);
  auto reference = cloneParams(params);
  OptimizerOptions o{OptimizerKind::kLamb, 0.01, 0.9, 0.01};
  // One layer map describing the default (every tensor a layer) gives the default's result.
  LayerMap map;
  for (size_t i = 0; i < params.size(); ++i) {
    map.segments.push_back({i, 0, params[i].numel(), i});
    map.oneDim.push_back(params[i].dim() == 1);
  }
  auto mapped = train::makeOptimizer(params, o, map);
  auto plain = train::makeOptimizer(reference, o);
  ASSERT_NE(dynamic_cast<train::Lamb*>(mapped.get()), nullptr);
  for (const auto& g : grads) {
    setGrads(params, g);
    setGrads(reference, g);
    mapped->step();
    plain->step();
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i]));

  o.kind = OptimizerKind::kLars;
  EXPECT_NE(dynamic_cast<train::Lars*>(train::makeOptimizer(params, o).get()), nullptr);
  // A map that leaves elements uncovered is refused.
  map.segments.pop_back();
  EXPECT_THROW(train::makeOptimizer(params, o, map), InvalidArgument);
}

TEST(LayerwiseOptimizer, NamesAndParameterServer) {
  EXPECT_EQ(parseOptimizer("lamb"), OptimizerKind::kLamb);
  EXPECT_EQ(parseOptimizer("lars"), OptimizerKind::kLars);
  EXPECT_EQ(toString(OptimizerKind::kLamb), "lamb");
  EXPECT_EQ(toString(OptimizerKind::kLars), "lars");
  ps::TrainingConfig c;
  c.optimizer.kind = OptimizerKind::kLars;
  try {
    c.validate();
    ADD_FAILURE() << "lars accepted by the parameter server";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not support lars"), std::string::npos) << e.what();
  }
  c.optimizer.kind = OptimizerKind::kLamb;
  EXPECT_THROW(ps::TrainingConfig::parse(c.toText()), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
