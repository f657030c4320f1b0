// DistributedDataParallel's errors: what a misuse, a model mismatch, a failing hook or collective
// and a departed peer report, on which ranks, with which type (ranks are threads).
#include <gtest/gtest.h>

#include <thread>

#include "comm/collectives.h"
#include "common/error.h"
#include "tests/ddp_test_util.h"
#include "tests/thread_ranks.h"
#include "train/ddp.h"
#include "train/tensor_types.h"

namespace shoal::test {
namespace {

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
