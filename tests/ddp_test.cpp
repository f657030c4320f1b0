// DistributedDataParallel against one process: N ranks with batch B per rank must end with the
// parameters of one process with batch N*B (ranks are threads over real shared memory here).
#include "train/ddp.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "comm/collectives.h"
#include "common/error.h"
#include "ps/server.h"
#include "tests/thread_ranks.h"
#include "train/optim.h"
#include "train/ps_trainer.h"
#include "train/tensor_types.h"

namespace shoal::test {
namespace {

constexpr int kRanks = 3;
constexpr int64_t kBatch = 4;  // per rank
constexpr int kSteps = 5;

struct NetImpl : torch::nn::Module {
  NetImpl(bool withUnused, bool withBatchNorm, bool withShared = false) {
    if (withShared) shared = register_module("shared", torch::nn::Linear(8, 8));
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    if (withBatchNorm) bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    if (withUnused) unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (shared) x = shared(torch::tanh(shared(x)));  // one parameter, two uses in the graph
    x = fc1(x);
    if (bn) x = bn(x);
    return fc2(torch::relu(x));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr}, shared{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

struct Case {
  std::string name;
  train::OptimizerKind optimizer = train::OptimizerKind::kSgd;
  bool overlap = true;
  bool noSyncAccumulation = false;  // two micro-batches per step, the first under noSync
  bool unused = false;
  bool batchNorm = false;
  bool shared = false;  // a layer applied twice
};

std::ostream& operator<<(std::ostream& o, const Case& c) {
  return o << c.name;
}

struct Data {
  std::vector<torch::Tensor> x, y;  // per step (and micro-batch): kRanks * kBatch rows
};

Data makeData(int batches) {
  torch::manual_seed(42);
  Data d;
  for (int i = 0; i < batches; ++i) {
    d.x.push_back(torch::randn({kRanks * kBatch, 8}));
    d.y.push_back(torch::randint(0, 4, {kRanks * kBatch}, torch::kInt64));
  }
  return d;
}

Net makeNet(const Case& c) {
  torch::manual_seed(7);
  return Net(c.unused, c.batchNorm, c.shared);
}

std::unique_ptr<torch::optim::Optimizer> makeOpt(Net& net, const Case& c) {
  train::OptimizerOptions o;
  o.kind = c.optimizer;
  o.lr = 0.05;
  return train::makeOptimizer(net->parameters(), o);
}

torch::Tensor rows(const torch::Tensor& t, int rank) {
  return t.slice(0, rank * kBatch, (rank + 1) * kBatch);
}

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

std::vector<torch::Tensor> stateOf(Net& net) {
  std::vector<torch::Tensor> s;
  for (auto& p : net->parameters()) s.push_back(p.detach().clone());
  for (auto& b : net->buffers()) s.push_back(b.clone());
  return s;
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

// Two ranks with the model of `c` compute a loss on one batch; `then` does the rest with it.
// Returns each rank's error text.
std::vector<std::string> lossOnTwoRanks(
    const Case& c,
    const std::function<void(train::DistributedDataParallel&, const torch::Tensor&)>& then) {
  torch::set_num_threads(1);
  std::vector<Net> nets;
  for (int r = 0; r < 2; ++r) nets.push_back(makeNet(c));
  auto data = makeData(1);
  return runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::DistributedDataParallel ddp(nets[g.rank()].ptr(), g.shared_from_this());
    then(ddp, torch::nn::functional::cross_entropy(nets[g.rank()]->forward(rows(data.x[0], 0)),
                                                   rows(data.y[0], 0)));
  });
}

TEST(Ddp, AnUnusedParameterWithoutDetectionIsNamed) {
  Case c{"unused"};
  c.unused = true;
  auto errors = lossOnTwoRanks(c, [](train::DistributedDataParallel& ddp,
                                     const torch::Tensor& loss) { ddp.backward(loss); });
  for (auto& e : errors) {
    EXPECT_NE(e.find("parameter 'unused.weight' got no gradient"), std::string::npos) << e;
    EXPECT_NE(e.find("findUnusedParameters"), std::string::npos) << e;
  }
}

TEST(Ddp, ASecondBackwardBeforeSynchronizingIsRefused) {
  auto errors =
      lossOnTwoRanks(Case{"twice"}, [](train::DistributedDataParallel&, const torch::Tensor& loss) {
        loss.backward({}, /*retain_graph=*/true);
        loss.backward();  // the gradients of the first are still being averaged
      });
  for (auto& e : errors) {
    EXPECT_NE(e.find("got a second gradient before the first was synchronized"), std::string::npos)
        << e;
  }
}

TEST(Ddp, DifferentModelsAreAMismatchOnEveryRank) {
  torch::set_num_threads(1);
  std::vector<std::shared_ptr<torch::nn::Module>> nets{
      std::make_shared<torch::nn::LinearImpl>(8, 4), std::make_shared<torch::nn::LinearImpl>(8, 4),
      std::make_shared<torch::nn::LinearImpl>(8, 5)};
  auto errors = runThreadRanks(3, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
    train::DistributedDataParallel ddp(nets[g.rank()], g.shared_from_this());
  });
  for (auto& e : errors) {
    EXPECT_NE(e.find("the ranks registered different parameters: rank 2 has 'weight [5, 8] "
                     "float' where rank 0 has 'weight [4, 8] float'"),
              std::string::npos)
        << e;
  }
}

TEST(Ddp, AWorldOfOneIsPlainTraining) {
  torch::set_num_threads(1);
  Case c{"one"};
  Net a = makeNet(c), b = makeNet(c);
  auto optA = makeOpt(a, c), optB = makeOpt(b, c);
  auto data = makeData(3);
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::DistributedDataParallel ddp(b.ptr(), g.shared_from_this());
    for (int s = 0; s < 3; ++s) {
      optA->zero_grad();
      torch::nn::functional::cross_entropy(a->forward(data.x[s]), data.y[s]).backward();
      optA->step();
      optB->zero_grad();
      ddp.beforeForward();
      ddp.backward(torch::nn::functional::cross_entropy(b->forward(data.x[s]), data.y[s]));
      optB->step();
    }
  });
  ASSERT_EQ(errors[0], "");
  auto sa = stateOf(a), sb = stateOf(b);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(torch::equal(sa[i], sb[i]));
}

TEST(Ddp, AWorldOfOneCommunicatesNothing) {
  torch::set_num_threads(1);
  Case c{"one"};
  c.batchNorm = true;  // buffers, which more ranks would broadcast
  Net net = makeNet(c);
  auto data = makeData(2);
  train::DistributedDataParallel::Stats stats;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this());
    for (int s = 0; s < 2; ++s) {
      ddp.beforeForward();
      ddp.backward(torch::nn::functional::cross_entropy(net->forward(data.x[s]), data.y[s]));
    }
    stats = ddp.stats();
    EXPECT_TRUE(ddp.bucketLayout().empty());
  });
  ASSERT_EQ(errors[0], "");
  EXPECT_EQ(stats.steps, 0);  // no reducer: backward() was loss.backward()
  EXPECT_EQ(stats.bufferSeconds, 0.0);
  EXPECT_EQ(stats.finishSeconds, 0.0);
}

// Buffers of three dtypes, one of them not contiguous.
struct BuffersImpl : torch::nn::Module {
  BuffersImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 2));
    stats = register_buffer("stats", torch::zeros({3}));
    counter = register_buffer("counter", torch::zeros({}, torch::kInt64));
    wide = register_buffer("wide", torch::zeros({2, 3}, torch::kFloat64).t());
  }
  void setFor(int rank, int step) {
    torch::NoGradGuard noGrad;
    stats.fill_(rank * 10 + step + 0.5);
    counter.fill_(rank * 1000 + step);
    wide.copy_(torch::arange(6, torch::kFloat64).view({3, 2}) * (rank + 1) + step);
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor stats, counter, wide;
};
TORCH_MODULE(Buffers);

TEST(Ddp, EveryBufferComesFromRankZeroBeforeEachForwardWhateverItsDtype) {
  torch::set_num_threads(1);
  std::vector<Buffers> nets{Buffers(), Buffers(), Buffers()};
  auto errors = runThreadRanks(3, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Buffers& net = nets[g.rank()];
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this());
    for (int step = 0; step < 3; ++step) {
      net->setFor(g.rank(), step);
      ddp.beforeForward();
      Buffers want;
      want->setFor(0, step);
      EXPECT_TRUE(torch::equal(net->stats, want->stats)) << "rank " << g.rank();
      EXPECT_TRUE(torch::equal(net->counter, want->counter)) << "rank " << g.rank();
      EXPECT_TRUE(torch::equal(net->wide, want->wide)) << "rank " << g.rank();
      ddp.backward(net->fc->forward(torch::ones({1, 4})).sum());
    }
    const auto s = ddp.stats();
    EXPECT_EQ(s.steps, 3);
    EXPECT_GT(s.bufferSeconds, 0.0);
    EXPECT_GT(s.finishSeconds, 0.0);
    // The layout is fixed at construction: a buffer that changes size is named.
    {
      torch::NoGradGuard noGrad;
      net->stats.set_(torch::zeros({4}));
    }
    try {
      ddp.beforeForward();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("buffer 'stats' changed size"), std::string::npos)
          << e.what();
    }
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

// Each rank's own gradients of one batch, computed without DDP on a copy of `c`'s model.
std::vector<torch::Tensor> localGradients(const Case& c, const torch::Tensor& x,
                                          const torch::Tensor& y) {
  Net net = makeNet(c);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad().clone());
  return g;
}

// True if t's elements lie inside `buffer`'s storage.
bool isViewInto(const torch::Tensor& t, const torch::Tensor& buffer) {
  auto* begin = static_cast<const char*>(buffer.data_ptr());
  auto* end = begin + buffer.numel() * buffer.element_size();
  auto* at = static_cast<const char*>(t.data_ptr());
  return at >= begin && at + t.numel() * t.element_size() <= end;
}

bool isViewIntoItsBucket(train::DistributedDataParallel& ddp, const torch::Tensor& grad,
                         size_t param) {
  auto layout = ddp.bucketLayout();
  for (size_t b = 0; b < layout.size(); ++b) {
    for (size_t p : layout[b]) {
      if (p == param) return grad.defined() && isViewInto(grad, ddp.bucketBuffer(b));
    }
  }
  return false;
}

TEST(Ddp, GradientsAreViewsIntoTheBucketsThroughRebuildZeroGradAndNoSync) {
  torch::set_num_threads(1);
  Case c{"views"};
  auto data = makeData(1);
  std::vector<Net> nets;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  for (int r = 0; r < 2; ++r) {
    nets.push_back(makeNet(c));
    opts.push_back(makeOpt(nets.back(), c));
  }
  // The average of the two ranks' gradients on their rows of the same batch.
  auto g0 = localGradients(c, rows(data.x[0], 0), rows(data.y[0], 0));
  auto g1 = localGradients(c, rows(data.x[0], 1), rows(data.y[0], 1));
  std::vector<std::string> failures(2);
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    train::DdpOptions o;
    o.bucketBytes = 300;
    o.firstBucketBytes = 100;
    train::DistributedDataParallel ddp(nets[r].ptr(), g.shared_from_this(), o);
    auto params = nets[r]->parameters();
    auto loss = [&] {
      return torch::nn::functional::cross_entropy(nets[r]->forward(rows(data.x[0], r)),
                                                  rows(data.y[0], r));
    };
    auto check = [&](const std::string& when, double factor) {
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& grad = params[i].grad();
        if (!isViewIntoItsBucket(ddp, grad, i)) {
          failures[r] += fmt::format("{}: parameter {} is not a view into its bucket; ", when, i);
          continue;
        }
        auto expected = (g0[i] + g1[i]) / 2 * factor;
        if (!torch::allclose(grad, expected, 1e-5, 1e-6)) {
          failures[r] += fmt::format("{}: parameter {} has the wrong gradient; ", when, i);
        }
      }
    };
    // No optimizer step anywhere: the parameters stay put, so every step's gradient is the same.
    ddp.backward(loss());  // the first iteration, then the rebuild re-points the views
    check("after the first step", 1);
    const auto before = ddp.bucketLayout();
    opts[r]->zero_grad();  // libtorch 1.13: zeroes in place, the views stay
    for (auto& p : params) {
      if (!p.grad().defined() || p.grad().abs().max().item<double>() != 0) {
        failures[r] += "zero_grad did not zero in place; ";
        break;
      }
    }
    ddp.backward(loss());
    check("after an in-place zero_grad", 1);
    nets[r]->zero_grad(/*set_to_none=*/true);
    ddp.backward(loss());
    check("after zero_grad(set_to_none)", 1);
    opts[r]->zero_grad();
    {
      auto guard = ddp.noSync();
      ddp.backward(loss());
    }
    ddp.backward(loss());
    check("after a noSync accumulation", 2);
    // A gradient the user assigned is what the parameter contributes.
    opts[r]->zero_grad();
    {
      torch::NoGradGuard noGrad;
      for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    }
    {
      auto guard = ddp.noSync();
      ddp.backward(loss());
    }
    ddp.backward(loss());
    for (size_t i = 0; i < params.size(); ++i) {
      auto expected = (g0[i] + g1[i]) + 1;  // 1 + 2 local gradients, averaged: 1 + 2 * average
      if (!isViewIntoItsBucket(ddp, params[i].grad(), i) ||
          !torch::allclose(params[i].grad(), expected, 1e-5, 1e-6)) {
        failures[r] += fmt::format("assigned gradient: parameter {} wrong; ", i);
      }
    }
    EXPECT_EQ(ddp.bucketLayout(), before) << "buckets are rebuilt once only";
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(failures[r], "") << "rank " << r;
  }
}

// Sums instead of averaging, in two steps (start, finish) with a counter per bucket that must
// survive from one iteration to the next, and be made afresh when the buckets are rebuilt.
class CountingSumHook : public train::ddp::CommHook {
 public:
  struct Count : train::ddp::BucketState {
    int starts = 0, finishes = 0;
  };
  std::unique_ptr<train::ddp::BucketState> makeState(comm::Group&,
                                                     const train::ddp::GradBucket& b) override {
    ++made[b.layoutVersion];
    return std::make_unique<Count>();
  }
  std::shared_ptr<comm::Work> start(comm::Group& g, train::ddp::GradBucket& b) override {
    auto& count = b.stateAs<Count>();
    if (count.starts != count.finishes) throw std::logic_error("start twice without finish");
    ++count.starts;
    return comm::allreduceAsync(g, b.buffer.data_ptr(), static_cast<size_t>(b.buffer.numel()),
                                train::toShoalType(b.buffer.scalar_type()), ReduceOp::kSum);
  }
  void finish(comm::Group&, train::ddp::GradBucket& b) override {
    auto& count = b.stateAs<Count>();
    ++count.finishes;
    seen[{b.layoutVersion, b.index}] = count.finishes;
  }
  std::string name() const override { return "counting sum"; }

  std::map<uint64_t, int> made;                     // layout version -> states made
  std::map<std::pair<uint64_t, size_t>, int> seen;  // (version, bucket) -> its finishes
};

TEST(Ddp, ACustomHookWithPerBucketStateReplacesTheAverage) {
  torch::set_num_threads(1);
  Case c{"hook"};
  auto data = makeData(1);
  std::vector<Net> nets;
  for (int r = 0; r < 2; ++r) nets.push_back(makeNet(c));
  auto g0 = localGradients(c, rows(data.x[0], 0), rows(data.y[0], 0));
  auto g1 = localGradients(c, rows(data.x[0], 1), rows(data.y[0], 1));
  std::vector<std::shared_ptr<CountingSumHook>> hooks{std::make_shared<CountingSumHook>(),
                                                      std::make_shared<CountingSumHook>()};
  std::vector<std::string> failures(2);
  std::vector<size_t> buckets(2);
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    train::DdpOptions o;
    o.bucketBytes = 300;
    o.firstBucketBytes = 100;
    o.commHook = hooks[r];
    train::DistributedDataParallel ddp(nets[r].ptr(), g.shared_from_this(), o);
    auto params = nets[r]->parameters();
    for (int step = 0; step < 4; ++step) {
      nets[r]->zero_grad();
      ddp.backward(torch::nn::functional::cross_entropy(nets[r]->forward(rows(data.x[0], r)),
                                                        rows(data.y[0], r)));
      for (size_t i = 0; i < params.size(); ++i) {
        if (!torch::allclose(params[i].grad(), g0[i] + g1[i], 1e-5, 1e-6)) {
          failures[r] += fmt::format("step {}: parameter {} is not the sum; ", step, i);
        }
      }
    }
    buckets[r] = ddp.bucketLayout().size();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(failures[r], "") << "rank " << r;
    auto& h = *hooks[r];
    ASSERT_EQ(h.made.size(), 2u) << "one layout at construction, one after the rebuild";
    EXPECT_EQ(h.made.at(2), static_cast<int>(buckets[r]));
    EXPECT_GT(buckets[r], 2u);
    for (auto& [key, finishes] : h.seen) {
      // The first layout served the first step; the rebuilt one the three after it.
      EXPECT_EQ(finishes, key.first == 1 ? 1 : 3)
          << "rank " << r << " layout " << key.first << " bucket " << key.second;
    }
    EXPECT_EQ(h.seen.size(), static_cast<size_t>(h.made.at(1) + h.made.at(2)));
  }
}

// A hook whose start() throws at its `failAt`-th call (counting from 0), on every rank alike.
class ThrowingHook : public train::ddp::AllreduceHook {
 public:
  explicit ThrowingHook(int failAt) : failAt_(failAt) {}
  std::shared_ptr<comm::Work> start(comm::Group& g, train::ddp::GradBucket& b) override {
    if (calls_++ == failAt_) {
      SHOAL_THROW(PeerError, "rank {}: injected: peer 9 vanished while sending bucket {}", g.rank(),
                  b.index);
    }
    return AllreduceHook::start(g, b);
  }

 private:
  int failAt_;
  int calls_ = 0;
};

TEST(Ddp, AHookThatThrowsReachesTheCallerAndTheNextStepWorks) {
  torch::set_num_threads(1);
  for (bool overlap : {true, false}) {
    Case c{"throwing"};
    auto data = makeData(1);
    std::vector<Net> nets;
    for (int r = 0; r < 2; ++r) nets.push_back(makeNet(c));
    auto g0 = localGradients(c, rows(data.x[0], 0), rows(data.y[0], 0));
    auto g1 = localGradients(c, rows(data.x[0], 1), rows(data.y[0], 1));
    std::vector<std::string> caught(2), failures(2);
    auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
      const int r = g.rank();
      train::DdpOptions o;
      o.overlap = overlap;
      o.bucketBytes = 300;
      o.firstBucketBytes = 100;
      o.commHook = std::make_shared<ThrowingHook>(1);  // the second bucket of the first step
      train::DistributedDataParallel ddp(nets[r].ptr(), g.shared_from_this(), o);
      auto loss = [&] {
        return torch::nn::functional::cross_entropy(nets[r]->forward(rows(data.x[0], r)),
                                                    rows(data.y[0], r));
      };
      try {
        ddp.backward(loss());
        caught[r] = "nothing thrown";
      } catch (const PeerError& e) {
        caught[r] = e.what();
      }
      nets[r]->zero_grad();
      ddp.backward(loss());  // the reducer recovered: a normal step
      auto params = nets[r]->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        if (!torch::allclose(params[i].grad(), (g0[i] + g1[i]) / 2, 1e-5, 1e-6)) {
          failures[r] += fmt::format("parameter {} wrong after the failed step; ", i);
        }
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r << " overlap " << overlap;
      EXPECT_EQ(failures[r], "") << "rank " << r << " overlap " << overlap;
      EXPECT_NE(caught[r].find("injected: peer 9 vanished while sending bucket 1"),
                std::string::npos)
          << caught[r];
    }
  }
}

// Rank 1 all-reduces one element fewer than rank 0: the collective fails (asynchronously,
// inside the Work) on both ranks.
class MismatchingHook : public train::ddp::CommHook {
 public:
  std::shared_ptr<comm::Work> start(comm::Group& g, train::ddp::GradBucket& b) override {
    const size_t n = static_cast<size_t>(b.buffer.numel()) - (g.rank() == 1 ? 1 : 0);
    return comm::allreduceAsync(g, b.buffer.data_ptr(), n, DataType::kFloat32, ReduceOp::kSum);
  }
  std::string name() const override { return "mismatching"; }
};

// A model whose unused layer is registered first: its gradient bucket goes last, so the
// buckets before it start (and fail, below) before DDP finds the parameter without gradient.
struct UnusedFirstImpl : torch::nn::Module {
  UnusedFirstImpl() {
    unused = register_module("unused", torch::nn::Linear(4, 4));
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear unused{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(UnusedFirst);

// Two ranks, each with `body(ddp, loss)`; small buckets. Returns what each rank caught, as
// "<type>: <message>", and runThreadRanks' errors in `errors`.
std::vector<std::string> failingStep(std::shared_ptr<train::ddp::CommHook> hook,
                                     double timeoutSeconds, bool rank1Leaves,
                                     std::vector<std::string>& errors) {
  torch::set_num_threads(1);
  auto data = makeData(1);
  std::vector<UnusedFirst> nets;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(7);
    nets.emplace_back();
  }
  std::vector<std::string> caught(2);
  errors = runThreadRanks(2, testOptions(TransportKind::kShm, timeoutSeconds), [&](comm::Group& g) {
    const int r = g.rank();
    train::DdpOptions o;
    o.bucketBytes = 300;
    o.firstBucketBytes = 100;
    o.commHook = hook;
    train::DistributedDataParallel ddp(nets[r].ptr(), g.shared_from_this(), o);
    ASSERT_GT(ddp.bucketLayout().size(), 2u);
    if (r == 1 && rank1Leaves) return;  // its group is destroyed: rank 0's collectives fail
    try {
      ddp.backward(torch::nn::functional::cross_entropy(nets[r]->forward(rows(data.x[0], r)),
                                                        rows(data.y[0], r)));
      caught[r] = "nothing thrown";
    } catch (const InvalidArgument& e) {
      caught[r] = std::string("InvalidArgument: ") + e.what();
    } catch (const PeerError& e) {
      caught[r] = std::string("PeerError: ") + e.what();
    } catch (const TimeoutError& e) {
      caught[r] = std::string("TimeoutError: ") + e.what();
    } catch (const MismatchError& e) {
      caught[r] = std::string("MismatchError: ") + e.what();
    } catch (const std::exception& e) {
      caught[r] = std::string("other: ") + e.what();
    }
  });
  return caught;
}

// Issue 10, item 3: DDP used to wait for the failed all-reduces silently and report the unused
// parameter instead. The collective's error must win, with its type.
TEST(Ddp, AFailedCollectiveIsReportedNotAnUnusedParameter) {
  std::vector<std::string> errors;
  auto caught = failingStep(std::make_shared<MismatchingHook>(), 20, false, errors);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(caught[r].rfind("MismatchError: ", 0) == 0 ||
                caught[r].rfind("PeerError: ", 0) == 0)
        << "rank " << r << ": " << caught[r];
    EXPECT_EQ(caught[r].find("got no gradient"), std::string::npos) << caught[r];
  }
}

// The same with the default hook and a peer that goes away.
TEST(Ddp, APeerThatLeavesIsReportedNotAnUnusedParameter) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors;
  auto caught = failingStep(train::ddp::averageAllreduce(), 10, true, errors);
  EXPECT_EQ(errors[0], "");
  EXPECT_TRUE(caught[0].rfind("PeerError: ", 0) == 0 || caught[0].rfind("TimeoutError: ", 0) == 0)
      << caught[0];
  EXPECT_EQ(caught[0].find("got no gradient"), std::string::npos) << caught[0];
  // Bounded by the group's timeout (10 s), with a generous margin.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Without a failure the unused parameter is still named (the check is not lost).
TEST(Ddp, AnUnusedParameterInALaterBucketIsNamed) {
  std::vector<std::string> errors;
  auto caught = failingStep(train::ddp::averageAllreduce(), 20, false, errors);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(caught[r].rfind("InvalidArgument: ", 0), 0u) << caught[r];
    EXPECT_NE(caught[r].find("parameter 'unused.weight' got no gradient"), std::string::npos)
        << caught[r];
  }
}

}  // namespace
}  // namespace shoal::test
