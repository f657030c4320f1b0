// Gradient compression through DDP's and ZeRO-1's communication hook
// (train/ddp/compression_hook.h), ranks as threads over real shared memory: every codec keeps
// the replicas identical at every world size, the casts stay close to the true average, error
// feedback loses nothing over steps, warm-up steps are exact (heavy-ball SGD's with the codec's
// momentum), and compression cuts the bytes a step really sends.
#include "train/ddp/compression_hook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "comm/collectives.h"
#include "common/error.h"
#include "tests/thread_ranks.h"
#include "train/ddp.h"
#include "train/tensor_types.h"
#include "train/zero/zero.h"

namespace shoal::test {
namespace {

using compress::CompressionSpec;

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t width = 32) {
    fc1 = register_module("fc1", torch::nn::Linear(16, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// The same initial parameters on every call: the seed is global, and ranks are threads.
Mlp seededMlp(int64_t width = 32) {
  static std::mutex seedMutex;
  std::lock_guard<std::mutex> lock(seedMutex);
  torch::manual_seed(7);
  return Mlp(width);
}

// Rank r's batch of step s: different on every rank and step, the same on every run.
std::pair<torch::Tensor, torch::Tensor> batchOf(int rank, int step) {
  auto gen = at::detail::createCPUGenerator(1000 * static_cast<uint64_t>(step) + rank);
  auto x = torch::randn({8, 16}, gen);
  auto y = torch::randn({8, 4}, gen);
  return {x, y};
}

torch::Tensor flatParams(torch::nn::Module& m) {
  std::vector<torch::Tensor> all;
  for (auto& p : m.parameters()) all.push_back(p.detach().reshape(-1));
  return torch::cat(all);
}

// Whether every rank holds exactly rank 0's `t` (one broadcast, compared bitwise).
bool sameOnEveryRank(comm::Group& g, const torch::Tensor& t) {
  auto root = t.clone();
  comm::broadcast(g, root.data_ptr(), static_cast<size_t>(root.numel()), DataType::kFloat32, 0);
  int differs = torch::equal(root, t) ? 0 : 1;
  comm::allreduce(g, &differs, 1, DataType::kInt32, ReduceOp::kMax);
  return differs == 0;
}

class EveryCodec : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EveryCodec, ReplicasStayIdenticalAndTheLossFalls) {
  torch::set_num_threads(1);
  const auto [specText, n] = GetParam();
  const auto spec = CompressionSpec::parse(specText);
  std::mutex mutex;
  std::vector<std::string> failures;
  auto errors = runThreadRanks(n, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Mlp net = seededMlp();
    train::DdpOptions o;
    o.commHook = train::ddp::compressionHook(spec);
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
    // A spec with momentum applies it in the hook: the optimizer has none then.
    torch::optim::SGD opt(net->parameters(),
                          torch::optim::SGDOptions(0.05).momentum(spec.momentum > 0 ? 0 : 0.9));
    // A fixed regression problem every rank samples from: the loss must fall.
    auto [x, y] = batchOf(g.rank(), 0);
    double first = 0, last = 0;
    for (int s = 0; s < 40; ++s) {
      opt.zero_grad();
      ddp.beforeForward();
      auto loss = torch::mse_loss(net->forward(x), y);
      ddp.backward(loss);
      opt.step();
      (s == 0 ? first : last) = loss.item<double>();
      if (!sameOnEveryRank(g, flatParams(*net))) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back(
            fmt::format("rank {} step {}: parameters differ from rank 0", g.rank(), s));
        return;
      }
    }
    if (!(last < 0.8 * first)) {
      std::lock_guard<std::mutex> lock(mutex);
      failures.push_back(fmt::format("rank {}: loss {} -> {} did not fall", g.rank(), first, last));
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_TRUE(failures.empty()) << failures.front();
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, EveryCodec,
    ::testing::Combine(::testing::Values("fp16", "bf16", "topk:0.1", "onebit", "powersgd:2",
                                         "powersgd:1,warmup=3", "topk:0.1,momentum=0.9",
                                         "onebit,momentum=0.9,warmup=2",
                                         "topk:0.1,momentum=0.9,dense=64", "onebit,dense=64"),
                       ::testing::Values(1, 2, 3, 4)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
      std::string name = std::get<0>(info.param);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name + "_n" + std::to_string(std::get<1>(info.param));
    });

// The gradients one step leaves in the model, with `spec`, on each of n ranks.
std::vector<torch::Tensor> gradientsAfter(const std::string& specText, int n, int steps) {
  std::vector<torch::Tensor> grads(static_cast<size_t>(n));
  auto errors = runThreadRanks(n, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Mlp net = seededMlp();
    train::DdpOptions o;
    o.commHook = train::ddp::compressionHook(CompressionSpec::parse(specText));
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
    for (int s = 0; s < steps; ++s) {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      auto [x, y] = batchOf(g.rank(), s);
      ddp.backward(torch::mse_loss(net->forward(x), y));
    }
    std::vector<torch::Tensor> all;
    for (auto& p : net->parameters()) all.push_back(p.grad().reshape(-1).clone());
    grads[static_cast<size_t>(g.rank())] = torch::cat(all);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return grads;
}

TEST(Compression, CastsStayCloseToTheTrueAverage) {
  torch::set_num_threads(1);
  auto exact = gradientsAfter("none", 3, 1)[0];
  for (auto [spec, tolerance] : {std::pair{"fp16", 2e-3}, std::pair{"bf16", 1.6e-2}}) {
    auto cast = gradientsAfter(spec, 3, 1)[0];
    const double err = ((cast - exact).abs().max() / exact.abs().max()).item<double>();
    EXPECT_LT(err, tolerance) << spec;
    EXPECT_GT(err, 0.0) << spec << ": a cast that changes nothing was not applied";
  }
}

TEST(Compression, WarmUpStepsAreTheExactAverage) {
  torch::set_num_threads(1);
  // Step 2 of 2 is still warm-up with warmup=2: bitwise the plain average; with warmup=1 not.
  auto exact = gradientsAfter("none", 2, 2)[0];
  EXPECT_TRUE(torch::equal(gradientsAfter("topk:0.05,warmup=2", 2, 2)[0], exact));
  EXPECT_FALSE(torch::equal(gradientsAfter("topk:0.05,warmup=1", 2, 2)[0], exact));
}

// With the codec's momentum, a warm-up step sends the velocity whole: the second step's
// gradients are m times the first step's average plus the second's (heavy-ball SGD's buffer),
// on every rank; once compression starts they are no longer.
TEST(Compression, WarmUpStepsWithMomentumAreHeavyBallSgd) {
  torch::set_num_threads(1);
  const auto first = gradientsAfter("none", 3, 1)[0], second = gradientsAfter("none", 3, 2)[0];
  const auto heavyBall = 0.9 * first + second;
  for (const char* spec : {"topk:0.05,momentum=0.9,warmup=2", "onebit,momentum=0.9,warmup=2"}) {
    const auto grads = gradientsAfter(spec, 3, 2);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(torch::allclose(grads[r], heavyBall, 1e-5, 1e-7)) << spec << " rank " << r;
    }
    EXPECT_FALSE(torch::allclose(gradientsAfter(spec, 3, 3)[0],
                                 0.9 * heavyBall + gradientsAfter("none", 3, 3)[0], 1e-3, 1e-5))
        << spec << ": step 3 is compressed";
  }
}

// dense=128 on the 16-32-4 model: fc1's bias (32), fc2's weight (128) and bias (4) are sent
// whole (the plain average; with momentum, heavy-ball SGD's buffer), fc1's 512 weights are the
// only top-k selection, 52 of them per rank.
TEST(Compression, DenseParametersAreSentWholeAndTheOthersEncodedAlone) {
  torch::set_num_threads(1);
  const int n = 3;
  const int64_t weights = 16 * 32;  // fc1's weight first in the flat gradients, then the rest
  const auto first = gradientsAfter("none", n, 1)[0], second = gradientsAfter("none", n, 2)[0];
  const auto sparse = [&](const torch::Tensor& t) { return t.narrow(0, 0, weights); };
  const auto dense = [&](const torch::Tensor& t) {
    return t.narrow(0, weights, t.numel() - weights);
  };
  const auto plain = gradientsAfter("topk:0.1,dense=128", n, 1);
  const auto corrected = gradientsAfter("topk:0.1,momentum=0.9,dense=128", n, 2);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::allclose(dense(plain[r]), dense(first), 1e-5, 1e-7)) << "rank " << r;
    const int64_t sent = sparse(plain[r]).ne(0).sum().item<int64_t>();
    EXPECT_GT(sent, 52);  // the ranks chose different elements
    EXPECT_LE(sent, 52 * n);
    EXPECT_TRUE(torch::allclose(dense(corrected[r]), dense(0.9 * first + second), 1e-5, 1e-7))
        << "rank " << r;
    EXPECT_LE(sparse(corrected[r]).ne(0).sum().item<int64_t>(), 52 * n);
  }
}

// Error feedback: with the same gradient every step, what the codec delivers over T steps adds
// up to T times that gradient, short only of the residual it still holds (bounded), though each
// step sends a tenth of the elements, or only signs. Without it, top-k would send the same
// elements every step and the others never; sign would deliver the mean magnitude everywhere.
// 1-bit with momentum 0.9 delivers heavy-ball SGD's distance, sum over t of (1 - 0.9^t) / 0.1
// times the gradient (it masks nothing: comm/compress/momentum_correction.h).
TEST(Compression, ErrorFeedbackDeliversTheWholeGradientOverSteps) {
  torch::set_num_threads(1);
  for (const char* spec : {"topk:0.1", "onebit", "onebit,momentum=0.9"}) {
    const int steps = 300;
    const double m = CompressionSpec::parse(spec).momentum;
    double factor = 0;  // heavy-ball's distance over the steps, in gradients
    for (int t = 1; t <= steps; ++t) factor += (1 - std::pow(m, t)) / (1 - m);
    torch::Tensor delivered, truth;
    auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
      Mlp net = seededMlp();
      train::DdpOptions o;
      o.commHook = train::ddp::compressionHook(CompressionSpec::parse(spec));
      train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
      auto [x, y] = batchOf(g.rank(), 0);
      torch::Tensor sum;
      for (int s = 0; s < steps; ++s) {
        for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
        ddp.backward(torch::mse_loss(net->forward(x), y));  // parameters never change
        std::vector<torch::Tensor> all;
        for (auto& p : net->parameters()) all.push_back(p.grad().reshape(-1).clone());
        auto grad = torch::cat(all);
        sum = s == 0 ? grad : sum + grad;
      }
      // The true average gradient, for comparison.
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      torch::mse_loss(net->forward(x), y).backward();
      std::vector<torch::Tensor> all;
      for (auto& p : net->parameters()) all.push_back(p.grad().reshape(-1).clone());
      auto mine = torch::cat(all);
      comm::allreduce(g, mine.data_ptr(), static_cast<size_t>(mine.numel()), DataType::kFloat32,
                      ReduceOp::kAvg);
      if (g.rank() == 0) {
        delivered = sum;
        truth = mine * factor;
      }
    });
    ASSERT_EQ(errors[0], "") << spec;
    ASSERT_EQ(errors[1], "") << spec;
    const double rel = ((delivered - truth).norm() / truth.norm()).item<double>();
    EXPECT_LT(rel, 0.1) << spec << ": error feedback should deliver nearly all of " << steps
                        << " steps' gradients";
  }
}

// A loss-scaling overflow (an inf gradient on one rank) reaches every rank as a non-finite
// gradient, as with the plain average, instead of failing the exchange; and the next step is
// finite again (the residual and the codec's velocity did not keep the inf), compressed or in
// the warm-up.
TEST(Compression, AnOverflowStepIsSeenByEveryRankAndForgotten) {
  torch::set_num_threads(1);
  for (const char* spec : {"onebit", "topk:0.5", "onebit,momentum=0.9", "topk:0.5,momentum=0.9",
                           "topk:0.5,momentum=0.9,warmup=5"}) {
    std::vector<int> nonFinite(2, 0), finiteAfter(2, 0);
    auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
      Mlp net = seededMlp();
      train::DdpOptions o;
      o.commHook = train::ddp::compressionHook(CompressionSpec::parse(spec));
      train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
      auto [x, y] = batchOf(g.rank(), 0);
      for (int s = 0; s < 3; ++s) {
        for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
        auto loss = torch::mse_loss(net->forward(x), y);
        if (s == 1 && g.rank() == 1) loss = loss * std::numeric_limits<float>::infinity();
        ddp.backward(loss);
        bool finite = true;
        for (auto& p : net->parameters())
          finite = finite && torch::isfinite(p.grad()).all().item<bool>();
        if (s == 1) nonFinite[static_cast<size_t>(g.rank())] = !finite;
        if (s == 2) finiteAfter[static_cast<size_t>(g.rank())] = finite;
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(errors[r], "") << spec << " rank " << r;
      EXPECT_TRUE(nonFinite[r]) << spec << " rank " << r << " did not see the overflow";
      EXPECT_TRUE(finiteAfter[r]) << spec << " rank " << r << ": the overflow stayed";
    }
  }
}

// Bytes a rank really sent for `steps` synchronized steps of a wider model with `spec`.
uint64_t bytesFor(const std::string& specText, int steps) {
  uint64_t bytes = 0;
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Mlp net = seededMlp(1024);
    train::DdpOptions o;
    o.commHook = train::ddp::compressionHook(CompressionSpec::parse(specText));
    o.broadcastBuffers = false;
    train::DistributedDataParallel ddp(net.ptr(), g.shared_from_this(), o);
    const uint64_t before = ddp.stats().bytesSent;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batchOf(g.rank(), s);
      ddp.backward(torch::mse_loss(net->forward(x), y));
    }
    if (g.rank() == 0) bytes = ddp.stats().bytesSent - before;
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return bytes;
}

TEST(Compression, BytesSentShrinkAsTheCodecPromises) {
  torch::set_num_threads(1);
  // 16 * 1024 + 1024 * 4 weights + biases: ~21.5 K floats, 86 KiB a step uncompressed.
  const uint64_t plain = bytesFor("none", 4);
  const uint64_t half = bytesFor("fp16", 4);
  const uint64_t topk = bytesFor("topk:0.01", 4);
  const uint64_t sign = bytesFor("onebit", 4);
  const uint64_t power = bytesFor("powersgd:2", 4);
  ASSERT_GT(plain, 4u * 21000u * 4u / 2);  // two ranks: about half the buffer each way at least
  EXPECT_NEAR(static_cast<double>(half) / plain, 0.5, 0.05);
  EXPECT_LT(static_cast<double>(topk) / plain, 0.05);
  EXPECT_LT(static_cast<double>(sign) / plain, 0.06);
  EXPECT_LT(static_cast<double>(power) / plain, 0.25);
}

TEST(Compression, ZeroStageOneTakesTheHookAndStagesTwoThreeRefuseIt) {
  torch::set_num_threads(1);
  for (const char* spec :
       {"powersgd:2", "topk:0.2", "topk:0.2,momentum=0.9", "onebit,momentum=0.9,dense=40"}) {
    auto errors = runThreadRanks(3, testOptions(TransportKind::kShm), [&](comm::Group& g) {
      Mlp net = seededMlp();
      train::zero::ZeroOptions o;
      o.stage = 1;
      o.bucketBytes = 1024;  // several units
      o.optimizer.lr = 0.05;
      // The codec's momentum replaces the optimizer's (compression_hook.h).
      if (CompressionSpec::parse(spec).momentum > 0) o.optimizer.momentum = 0;
      o.commHook = train::ddp::compressionHook(CompressionSpec::parse(spec));
      train::zero::ZeroDataParallel zero(net.ptr(), g.shared_from_this(), o);
      auto [x, y] = batchOf(g.rank(), 0);
      double first = 0, last = 0;
      for (int s = 0; s < 40; ++s) {
        zero.beforeForward();
        auto loss = torch::mse_loss(net->forward(x), y);
        zero.backward(loss);
        zero.step();
        (s == 0 ? first : last) = loss.item<double>();
        SHOAL_CHECK(sameOnEveryRank(g, flatParams(*net)), "step {}: replicas differ", s);
      }
      SHOAL_CHECK(last < 0.8 * first, "loss {} -> {} did not fall", first, last);
    });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << spec << " rank " << r;
  }
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    Mlp net = seededMlp();
    train::zero::ZeroOptions o;
    o.stage = 2;
    o.commHook = train::ddp::compressionHook(CompressionSpec::parse("fp16"));
    EXPECT_THROW(train::zero::ZeroDataParallel(net.ptr(), g.shared_from_this(), o),
                 InvalidArgument);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace shoal::test
