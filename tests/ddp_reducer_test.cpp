// DistributedDataParallel's reducer and hooks: a world of one, buffers from rank 0, gradients as
// views into the buckets (through rebuild, zero_grad and noSync), a custom hook with per-bucket
// state (ranks are threads over real shared memory).
#include <gtest/gtest.h>

#include <map>

#include "comm/collectives.h"
#include "common/error.h"
#include "tests/ddp_test_util.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"
#include "train/ddp.h"
#include "train/ddp_checkpoint.h"
#include "train/tensor_types.h"

namespace shoal::test {
namespace {

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

// Buckets of a few parameters each, so the tests' small networks have several.
train::DdpOptions smallBuckets() {
  train::DdpOptions o;
  o.bucketBytes = 300;
  o.firstBucketBytes = 100;
  return o;
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
    const train::DdpOptions o = smallBuckets();
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

// Registered in the opposite order of their use: backward makes `last`'s gradients ready first,
// so DDP's rebuild after the first iteration changes the order a new DDP starts with.
struct SwappedImpl : torch::nn::Module {
  SwappedImpl() {
    last = register_module("last", torch::nn::Linear(16, 4));
    first = register_module("first", torch::nn::Linear(8, 16));
  }
  torch::Tensor forward(torch::Tensor x) { return last(torch::relu(first(x))); }
  torch::nn::Linear last{nullptr}, first{nullptr};
};
TORCH_MODULE(Swapped);

// A checkpoint keeps DDP's rebuilt bucket order (train/ddp_checkpoint.h): a fresh DDP that loads
// it takes the layout the saving job had (the compression hooks encode bucket by bucket, so a
// resumed job must see the same buckets), and keeps it after its first iteration.
TEST(Ddp, ACheckpointCarriesTheRebuiltBucketOrder) {
  torch::set_num_threads(1);
  auto data = makeData(1);
  TempDir dir;
  std::vector<std::vector<std::vector<size_t>>> initial(2), saved(2), loaded(2), after(2);
  std::vector<std::string> failures(2);
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    const int r = g.rank();
    const train::DdpOptions o = smallBuckets();
    auto run = [&](train::DistributedDataParallel& ddp, Swapped& net) {
      ddp.beforeForward();
      auto out = net->forward(rows(data.x[0], r));
      ddp.backward(torch::nn::functional::cross_entropy(out, rows(data.y[0], r)));
    };
    torch::manual_seed(1);
    Swapped net;
    torch::optim::SGD opt(net->parameters(), 0.1);
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
    initial[r] = ddp.bucketLayout();
    run(ddp, net);
    saved[r] = ddp.bucketLayout();
    std::vector<torch::Tensor> grads;
    for (auto& p : net->parameters()) grads.push_back(p.grad().clone());
    train::saveDdpShards(g, dir.path, *net, opt, train::OptimizerOptions{}, {1, 0, 1}, 2, &ddp);
    Swapped fresh;
    torch::optim::SGD freshOpt(fresh->parameters(), 0.1);
    train::DistributedDataParallel resumed(fresh.ptr(), g.shared_from_this(), o);
    if (!train::loadDdpShards(g, dir.path, *fresh, freshOpt, train::OptimizerOptions{}, {},
                              &resumed)) {
      failures[r] += "no checkpoint loaded; ";
    }
    loaded[r] = resumed.bucketLayout();
    run(resumed, fresh);
    after[r] = resumed.bucketLayout();
    // The same parameters (no optimizer step) and data: the same averaged gradients.
    const auto params = fresh->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined() || !torch::equal(params[i].grad(), grads[i])) {
        failures[r] += fmt::format("parameter {}: another gradient after loading; ", i);
      }
    }
    try {
      resumed.adoptBucketOrder({0, 0, 1, 2});
      failures[r] += "an order that is not a permutation was adopted; ";
    } catch (const InvalidArgument&) {
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(failures[r], "") << "rank " << r;
    EXPECT_NE(initial[r], saved[r]) << "the rebuild must change the order for this test to tell";
    EXPECT_EQ(loaded[r], saved[r]) << "rank " << r;
    EXPECT_EQ(after[r], saved[r]) << "rank " << r << ": rebuilt again after loading";
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
    train::DdpOptions o = smallBuckets();
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

}  // namespace
}  // namespace shoal::test
