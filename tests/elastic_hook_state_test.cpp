// train/elastic_hook_state.h with ranks as threads: after a view change a rank that committed
// the step the job continues from gets its own hook state of that step back, bit for bit (not
// the one the failed step left), and a rank that did not gets the holders' mean of the
// per-rank tensors, their shared ones and their step count.
#include "train/elastic_hook_state.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "tests/thread_ranks.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"

namespace shoal::test {
namespace {

using train::ddp::HookState;

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

HookState sorted(HookState s) {
  s.sortTensors();
  return s;
}

std::shared_ptr<train::ddp::CommHook> hookOf(const std::string& spec) {
  return train::ddp::compressionHook(compress::CompressionSpec::parse(spec));
}

// A rank's model and its DDP with a hook made from `spec` (the ranks' models need not agree
// here: only the hooks are compared).
struct Replica {
  Replica(comm::Group& g, const std::string& spec) {
    torch::manual_seed(7);
    o.commHook = hookOf(spec);
    ddp.emplace(net.ptr(), g.shared_from_this(), o);
  }
  Mlp net;
  train::DdpOptions o;
  std::optional<train::DistributedDataParallel> ddp;
};

// One synchronized step on rank-and-step-specific data: it changes the hook's state.
void step(train::DistributedDataParallel& ddp, Mlp& net, int rank, int s) {
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  auto gen = at::detail::createCPUGenerator(1000 * static_cast<uint64_t>(s) + rank);
  auto x = torch::randn({8, 16}, gen);
  auto y = torch::randn({8, 4}, gen);
  ddp.backward(torch::mse_loss(net->forward(x), y));
}

using train::BucketsBuilt;

class ElasticHookStateSpec
    : public ::testing::TestWithParam<std::tuple<std::string, BucketsBuilt>> {};

// Ranks 0 and 1 commit steps 2 and 3; rank 2 commits nothing (a survivor that had not got
// there, or with kAfterRestore a joiner: a new hook that never made a bucket). Step 4 fails;
// the job continues from step 2, the older of the two copies. With kAfterRestore the view's
// DDP is built after restore() (as inside ElasticState's function) and must take the state
// over.
TEST_P(ElasticHookStateSpec, HoldersGetTheirOwnStateBackAndTheOthersTheHoldersMean) {
  torch::set_num_threads(1);
  const auto [spec, buckets] = GetParam();
  std::mutex mutex;
  std::map<int, HookState> atTwo, restored;
  auto errors = runThreadRanks(3, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Replica rep(g, spec);
    auto& [net, o, ddp] = rep;
    const bool holder = g.rank() < 2;
    for (int s = 1; s <= 4; ++s) {
      step(*ddp, net, g.rank(), s);
      if (holder && s == 2) {
        std::lock_guard<std::mutex> lock(mutex);
        atTwo[g.rank()] = sorted(*o.commHook->exportState());
      }
    }
    // Rank 2's copy of the whole run is never taken; the holders' are taken at steps 2 and 3.
    if (buckets == BucketsBuilt::kAfterRestore) {
      ddp.reset();
      if (!holder) o.commHook = hookOf(spec);
    }
    train::ElasticHookState kept(o.commHook, *net, buckets);
    if (holder) {
      // The states of steps 2 and 3, as the commits took them (atTwo, and the current one).
      auto now = *o.commHook->exportState();
      HookState two = atTwo.at(g.rank());
      o.commHook->importState(two);
      kept.take(2);
      o.commHook->importState(now);
      kept.take(3);
    }
    kept.restore(g, 2);
    if (buckets == BucketsBuilt::kAfterRestore) ddp.emplace(net.ptr(), g.shared_from_this(), o);
    std::lock_guard<std::mutex> lock(mutex);
    restored[g.rank()] = sorted(*o.commHook->exportState());
  });
  for (int r = 0; r < 3; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  const auto& a = atTwo.at(0);
  const auto& b = atTwo.at(1);
  ASSERT_FALSE(a.tensors.empty());
  ASSERT_EQ(a.steps, 2);
  bool changedSince = false;  // the failed step moved the state: the restore has work to do
  for (int r = 0; r < 2; ++r) {
    const auto& want = atTwo.at(r);
    const auto& got = restored.at(r);
    EXPECT_EQ(got.steps, want.steps);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      EXPECT_TRUE(torch::equal(got.tensors[i].data, want.tensors[i].data))
          << "rank " << r << ": " << got.tensors[i].key << " of parameter " << got.tensors[i].param
          << " is not its own of step 2";
    }
  }
  const auto& joiner = restored.at(2);
  EXPECT_EQ(joiner.kind, a.kind);
  EXPECT_EQ(joiner.steps, 2);
  ASSERT_EQ(joiner.tensors.size(), a.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& t = joiner.tensors[i];
    EXPECT_EQ(t.key, a.tensors[i].key);
    EXPECT_EQ(t.param, a.tensors[i].param);
    if (t.perRank) {
      const auto mean = (a.tensors[i].data + b.tensors[i].data) / 2;
      EXPECT_TRUE(torch::allclose(t.data, mean, 1e-6, 1e-7))
          << t.key << " of parameter " << t.param << ": not the holders' mean";
      changedSince |= !torch::equal(a.tensors[i].data, b.tensors[i].data);
    } else {
      EXPECT_TRUE(torch::equal(t.data, a.tensors[i].data))
          << t.key << " of parameter " << t.param << ": not the holders' shared value";
    }
  }
  EXPECT_TRUE(changedSince) << "the holders' residuals were equal: the mean proves nothing";
}

INSTANTIATE_TEST_SUITE_P(
    Hooks, ElasticHookStateSpec,
    ::testing::Combine(::testing::Values("topk:0.1,momentum=0.9", "powersgd:1", "onebit"),
                       ::testing::Values(BucketsBuilt::kBeforeRestore,
                                         BucketsBuilt::kAfterRestore)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, BucketsBuilt>>& info) {
      std::string name = std::get<0>(info.param);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name +
             (std::get<1>(info.param) == BucketsBuilt::kBeforeRestore ? "_before" : "_after");
    });

// When every rank committed the step, each gets its own state back and nothing else changes.
TEST(ElasticHookState, EveryRankHoldingTheStepGetsItsOwnBack) {
  torch::set_num_threads(1);
  std::mutex mutex;
  std::map<int, std::pair<HookState, HookState>> states;  // taken, restored
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Replica rep(g, "topk:0.1");
    auto& [net, o, ddp] = rep;
    train::ElasticHookState kept(o.commHook, *net, BucketsBuilt::kBeforeRestore);
    step(*ddp, net, g.rank(), 1);
    kept.take(1);
    auto taken = sorted(*o.commHook->exportState());
    step(*ddp, net, g.rank(), 2);
    kept.restore(g, 1);
    std::lock_guard<std::mutex> lock(mutex);
    states[g.rank()] = {std::move(taken), sorted(*o.commHook->exportState())};
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (const auto& [rank, pair] : states) {
    const auto& [taken, got] = pair;
    EXPECT_EQ(got.steps, 1);
    ASSERT_EQ(got.tensors.size(), taken.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      EXPECT_TRUE(torch::equal(got.tensors[i].data, taken.tensors[i].data)) << "rank " << rank;
    }
  }
}

// A cast hook keeps only its warm-up count: a rank without a copy (a joiner's new hook) gets the
// holders' count, so that it starts casting on the same step as they do.
TEST(ElasticHookState, ARankWithoutACopyGetsACastHooksWarmUpCount) {
  torch::set_num_threads(1);
  std::mutex mutex;
  std::map<int, int64_t> steps;
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Replica rep(g, "fp16,warmup=5");
    auto& [net, o, ddp] = rep;
    if (g.rank() == 1) o.commHook = hookOf("fp16,warmup=5");  // a new hook, as a joiner's
    train::ElasticHookState kept(o.commHook, *net, BucketsBuilt::kAfterRestore);
    for (int s = 1; s <= 3; ++s) step(*ddp, net, g.rank(), s);
    if (g.rank() == 0) kept.take(3);
    kept.restore(g, 3);
    std::lock_guard<std::mutex> lock(mutex);
    steps[g.rank()] = o.commHook->exportState()->steps;
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(steps.at(0), 3);
  EXPECT_EQ(steps.at(1), 3) << "the new hook did not get the holder's warm-up count";
}

}  // namespace
}  // namespace shoal::test
