// DistributedDataParallel against one process: N ranks with batch B per rank must end with the
// parameters of one process with batch N*B (ranks are threads over real shared memory here);
// and synchronous parameter-server training against DDP.
#include <gtest/gtest.h>

#include "ps/server.h"
#include "tests/ddp_test_util.h"
#include "tests/thread_ranks.h"
#include "train/ddp.h"
#include "train/ps_trainer.h"

namespace shoal::test {
namespace {

// One process, the whole batch. With BatchNorm the ranks normalize their own slices, so the
// reference does the same: a forward per slice, loss = mean of the slice losses, and the
// running statistics as slice 0's forward left them (DDP keeps rank 0's buffers): they are
// returned in `slice0Buffers`, to be put back after backward (autograd saved the live ones).
torch::Tensor referenceLoss(Net& net, const Case& c, const torch::Tensor& x, const torch::Tensor& y,
                            std::vector<torch::Tensor>& slice0Buffers) {
  namespace F = torch::nn::functional;
  if (!c.batchNorm) return F::cross_entropy(net->forward(x), y);
  torch::Tensor total = F::cross_entropy(net->forward(rows(x, 0)), rows(y, 0));
  slice0Buffers.clear();
  for (auto& b : net->buffers()) slice0Buffers.push_back(b.clone());
  for (int r = 1; r < kRanks; ++r) {
    total = total + F::cross_entropy(net->forward(rows(x, r)), rows(y, r));
  }
  return total / kRanks;
}

class DdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, NRanksEqualOneProcessWithNTimesTheBatch) {
  const Case c = GetParam();
  torch::set_num_threads(1);
  const int micro = c.noSyncAccumulation ? 2 : 1;
  Data data = makeData(kSteps * micro);

  Net reference = makeNet(c);
  auto refOpt = makeOpt(reference, c);
  for (int s = 0; s < kSteps; ++s) {
    refOpt->zero_grad();
    for (int m = 0; m < micro; ++m) {
      std::vector<torch::Tensor> buffers;
      (referenceLoss(reference, c, data.x[s * micro + m], data.y[s * micro + m], buffers) / micro)
          .backward();
      torch::NoGradGuard g;
      auto live = reference->buffers();
      for (size_t i = 0; i < buffers.size(); ++i) live[i].copy_(buffers[i]);
    }
    refOpt->step();
  }
  auto expected = stateOf(reference);

  // Models and optimizers made here: torch's global generator is not for concurrent seeding.
  std::vector<Net> nets;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  for (int r = 0; r < kRanks; ++r) {
    nets.push_back(makeNet(c));
    // Rank 0's initial parameters must win: perturb the others.
    if (r > 0) {
      torch::NoGradGuard g;
      for (auto& p : nets.back()->parameters()) p.add_(1.0);
    }
    opts.push_back(makeOpt(nets.back(), c));
  }
  std::vector<std::vector<torch::Tensor>> finals(kRanks);
  auto errors = runThreadRanks(kRanks, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    train::DdpOptions o;
    o.overlap = c.overlap;
    o.findUnusedParameters = c.unused;
    o.bucketBytes = 300;  // several buckets, to exercise ordering and the rebuild
    o.firstBucketBytes = 100;
    train::DistributedDataParallel ddp(nets[r].ptr(), g.shared_from_this(), o);
    namespace F = torch::nn::functional;
    for (int s = 0; s < kSteps; ++s) {
      opts[r]->zero_grad();
      for (int m = 0; m < micro; ++m) {
        const int i = s * micro + m;
        ddp.beforeForward();
        auto loss =
            F::cross_entropy(nets[r]->forward(rows(data.x[i], r)), rows(data.y[i], r)) / micro;
        if (m + 1 < micro) {
          auto guard = ddp.noSync();
          ddp.backward(loss);
        } else {
          ddp.backward(loss);
        }
      }
      opts[r]->step();
    }
    if (c.batchNorm) ddp.beforeForward();  // every rank holds rank 0's statistics
    finals[r] = stateOf(nets[r]);
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(finals[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(finals[r][i].to(torch::kFloat64), expected[i].to(torch::kFloat64),
                                  1e-5, 1e-6))
          << c.name << ": rank " << r << " tensor " << i << " differs by "
          << (finals[r][i].to(torch::kFloat64) - expected[i].to(torch::kFloat64))
                 .abs()
                 .max()
                 .item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    , DdpEquivalence,
    ::testing::Values(Case{"sgd_overlap"},
                      Case{"sgd_after_backward", train::OptimizerKind::kSgd, false},
                      Case{"adam_overlap", train::OptimizerKind::kAdam},
                      Case{"adam_after_backward", train::OptimizerKind::kAdam, false},
                      Case{"sgd_no_sync_accumulation", train::OptimizerKind::kSgd, true, true},
                      Case{"adam_unused_parameter", train::OptimizerKind::kAdam, true, false, true},
                      Case{"sgd_batch_norm", train::OptimizerKind::kSgd, true, false, false, true},
                      Case{"adam_shared_layer", train::OptimizerKind::kAdam, true, false, false,
                           false, true}),
    [](const auto& info) { return info.param.name; });

// Synchronous parameter-server training (3 workers, 2 servers, the optimizer on the servers)
// against all-reduce data parallelism (3 ranks, libtorch's optimizer) on the same data order.
class PsSyncEquivalence : public ::testing::TestWithParam<train::OptimizerKind> {};

TEST_P(PsSyncEquivalence, EndsWithTheParametersOfAllreduceDataParallelism) {
  Case c{"ps"};
  c.optimizer = GetParam();
  torch::set_num_threads(1);
  Data data = makeData(kSteps);
  namespace F = torch::nn::functional;

  std::vector<Net> ddpNets, psNets;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  for (int r = 0; r < kRanks; ++r) {
    ddpNets.push_back(makeNet(c));
    opts.push_back(makeOpt(ddpNets.back(), c));
    psNets.push_back(makeNet(c));
  }
  std::vector<std::vector<torch::Tensor>> viaDdp(kRanks), viaPs(kRanks);
  auto errors = runThreadRanks(kRanks, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    train::DistributedDataParallel ddp(ddpNets[r].ptr(), g.shared_from_this());
    for (int s = 0; s < kSteps; ++s) {
      opts[r]->zero_grad();
      ddp.beforeForward();
      ddp.backward(F::cross_entropy(ddpNets[r]->forward(rows(data.x[s], r)), rows(data.y[s], r)));
      opts[r]->step();
    }
    viaDdp[r] = stateOf(ddpNets[r]);
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "ddp rank " << r;

  constexpr int kServers = 2;
  ps::TrainingConfig config;
  config.mode = ps::Mode::kSync;
  config.optimizer.kind = c.optimizer;
  config.optimizer.lr = 0.05;
  errors = runThreadRanks(kRanks + kServers, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    if (r >= kRanks) {
      ps::ServerOptions o;
      o.quiet = true;
      ps::serve(g, r - kRanks, kServers, kRanks, o);
      return;
    }
    train::PsTrainer trainer(g, r, kRanks, kServers, *psNets[r], config);
    for (int s = 0; s < kSteps; ++s) {
      psNets[r]->zero_grad();
      F::cross_entropy(psNets[r]->forward(rows(data.x[s], r)), rows(data.y[s], r)).backward();
      trainer.step(s);
    }
    trainer.finish();
    viaPs[r] = stateOf(psNets[r]);
  });
  for (int r = 0; r < kRanks + kServers; ++r) ASSERT_EQ(errors[r], "") << "ps rank " << r;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(viaPs[r].size(), viaDdp[0].size());
    for (size_t i = 0; i < viaDdp[0].size(); ++i) {
      EXPECT_TRUE(torch::allclose(viaPs[r][i].to(torch::kFloat64), viaDdp[0][i].to(torch::kFloat64),
                                  1e-5, 1e-6))
          << "worker " << r << " tensor " << i << " differs by "
          << (viaPs[r][i] - viaDdp[0][i]).abs().max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, PsSyncEquivalence,
                         ::testing::Values(train::OptimizerKind::kSgd, train::OptimizerKind::kAdam,
                                           train::OptimizerKind::kRmsprop),
                         [](const auto& info) { return std::string(toString(info.param)); });

}  // namespace
}  // namespace shoal::test
