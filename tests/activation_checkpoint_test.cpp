// Activation checkpointing: the gradients (of inputs and of every parameter) equal those of the
// plain model, with dropout too (the recompute draws the forward's masks, the caller's random
// stream is left as without checkpointing), across several micro-batches whose backwards run in
// any order, nested, unused; misuse is a one-line InvalidArgument; and the activations kept
// for backward really shrink, measured through c10's CPU allocator.
#include "train/activation_checkpoint.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "train/residual_mlp.h"

namespace shoal::test {
namespace {

using train::checkpoint;
using train::Checkpointed;
using train::CheckpointOptions;

// Each parameter's .grad (undefined ones stay undefined), cloned.
std::vector<torch::Tensor> grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (const auto& p : m.parameters())
    g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  return g;
}

void clearGrads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
}

// Equal within rtol 1e-6 of the larger magnitude (the recompute runs the same kernels on the
// same data, so in practice they are bitwise equal; the tolerance only spares the test from
// depending on that).
void expectClose(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double scale = std::max(a.abs().max().item<double>(), b.abs().max().item<double>());
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, 1e-6 * scale) << what << ": max difference " << diff << " at scale " << scale;
}

void expectSameGrads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expectClose(a[i], b[i], "parameter " + std::to_string(i));
}

// Runs the Sequential layer by layer, each layer checkpointed on its own.
torch::Tensor forwardEachLayerCheckpointed(torch::nn::Sequential& net, torch::Tensor x,
                                           CheckpointOptions options = {}) {
  for (torch::nn::AnyModule& layer : *net) {
    x = checkpoint([&layer](const torch::Tensor& t) { return layer.forward(t); }, x, options);
  }
  return x;
}

torch::Tensor lossOf(const torch::Tensor& out) {
  return out.pow(2).sum();
}

TEST(ActivationCheckpoint, ResidualMlpGradientsEqualThePlainModel) {
  torch::manual_seed(1);
  auto net = train::residualMlp(4, 64);
  const torch::Tensor images = torch::randn({8, 1, 28, 28});

  auto x = images.clone().requires_grad_(true);
  lossOf(net->forward(x)).backward();
  const auto plain = grads(*net);
  const torch::Tensor plainInputGrad = x.grad().clone();

  // Each layer checkpointed.
  clearGrads(*net);
  auto x1 = images.clone().requires_grad_(true);
  lossOf(forwardEachLayerCheckpointed(net, x1)).backward();
  expectSameGrads(grads(*net), plain);
  expectClose(x1.grad(), plainInputGrad, "input gradient, per-layer checkpoints");

  // The whole model as one checkpointed stage.
  clearGrads(*net);
  Checkpointed stage(net);
  auto x2 = images.clone().requires_grad_(true);
  lossOf(stage(x2)).backward();
  expectSameGrads(grads(*net), plain);
  expectClose(x2.grad(), plainInputGrad, "input gradient, whole-model checkpoint");
}

TEST(ActivationCheckpoint, CheckpointedSeesThroughToTheChildsParameters) {
  torch::manual_seed(2);
  auto net = train::residualMlp(2, 16);
  Checkpointed wrapped(net);
  EXPECT_EQ(wrapped->parameters().size(), net->parameters().size());
  EXPECT_EQ(wrapped->named_parameters().begin()->key(), "child.stem.weight");

  train::ResidualBlock block(16);
  Checkpointed any{torch::nn::AnyModule(block)};
  EXPECT_EQ(any->parameters().size(), block->parameters().size());
  const torch::Tensor x = torch::randn({3, 16});
  lossOf(block(x)).backward();
  const auto plain = grads(*block);
  clearGrads(*block);
  lossOf(any(x)).backward();
  expectSameGrads(grads(*block), plain);
}

TEST(ActivationCheckpoint, InputsWithoutGradStillGiveParameterGradients) {
  torch::manual_seed(3);
  auto net = train::residualMlp(3, 32);
  const torch::Tensor images = torch::randn({5, 1, 28, 28});  // a first stage's input
  lossOf(net->forward(images)).backward();
  const auto plain = grads(*net);

  clearGrads(*net);
  Checkpointed stage(net);
  const torch::Tensor out = stage(images);
  EXPECT_TRUE(out.requires_grad());
  lossOf(out).backward();
  expectSameGrads(grads(*net), plain);
  for (const auto& g : grads(*net)) EXPECT_TRUE(g.defined());
}

torch::nn::Sequential dropoutNet() {
  torch::nn::Sequential net;
  net->push_back("fc1", torch::nn::Linear(32, 64));
  net->push_back("drop1", torch::nn::Dropout(0.5));
  net->push_back("relu", torch::nn::ReLU());
  net->push_back("fc2", torch::nn::Linear(64, 64));
  net->push_back("drop2", torch::nn::Dropout(0.3));
  net->push_back("fc3", torch::nn::Linear(64, 8));
  return net;
}

struct DropoutRun {
  torch::Tensor out, inputGrad;
  std::vector<torch::Tensor> grads;
  torch::Tensor drawnBetween, drawnAfter;  // the caller's random stream
};

// Seeds, runs forward, draws, runs backward, draws: with `wrap` the forward is checkpointed.
DropoutRun runDropout(torch::nn::Sequential& net, const torch::Tensor& input, bool wrap,
                      CheckpointOptions options = {}) {
  clearGrads(*net);
  torch::manual_seed(42);
  auto x = input.clone().requires_grad_(true);
  DropoutRun r;
  r.out = wrap ? Checkpointed(net, options)->forward(x) : net->forward(x);
  r.drawnBetween = torch::rand({16});
  lossOf(r.out).backward();
  r.drawnAfter = torch::rand({16});
  r.inputGrad = x.grad().clone();
  r.grads = grads(*net);
  return r;
}

TEST(ActivationCheckpoint, DropoutMasksAndTheCallersRandomStreamMatch) {
  torch::manual_seed(4);
  auto net = dropoutNet();
  const torch::Tensor input = torch::randn({16, 32});
  const DropoutRun plain = runDropout(net, input, false);
  const DropoutRun ckpt = runDropout(net, input, true);
  EXPECT_TRUE(torch::equal(ckpt.out, plain.out));
  expectSameGrads(ckpt.grads, plain.grads);
  expectClose(ckpt.inputGrad, plain.inputGrad, "input gradient");
  EXPECT_TRUE(torch::equal(ckpt.drawnBetween, plain.drawnBetween));
  EXPECT_TRUE(torch::equal(ckpt.drawnAfter, plain.drawnAfter))
      << "the recompute perturbed the caller's random stream";

  // The control: without preserving the generator the recompute draws other masks, so the
  // gradients are wrong and the stream after backward has moved on. Shows the check above
  // can fail.
  const DropoutRun loose = runDropout(net, input, true, CheckpointOptions{.preserveRng = false});
  EXPECT_FALSE(torch::allclose(loose.grads[0], plain.grads[0]));
  EXPECT_FALSE(torch::equal(loose.drawnAfter, plain.drawnAfter));
}

TEST(ActivationCheckpoint, TwoMicroBatchesBackwardInReverseOrder) {
  torch::manual_seed(5);
  auto net = train::residualMlp(3, 32);
  net->push_back("drop", torch::nn::Dropout(0.2));
  const torch::Tensor a = torch::randn({4, 1, 28, 28}), b = torch::randn({6, 1, 28, 28});

  auto run = [&](bool wrap) {
    clearGrads(*net);
    torch::manual_seed(9);
    auto xa = a.clone().requires_grad_(true), xb = b.clone().requires_grad_(true);
    Checkpointed stage(net);
    auto forward = [&](const torch::Tensor& x) { return wrap ? stage(x) : net->forward(x); };
    const torch::Tensor outA = forward(xa);
    const torch::Tensor outB = forward(xb);
    lossOf(outB).backward();  // the later micro-batch first
    lossOf(outA).backward();
    return std::make_tuple(grads(*net), xa.grad().clone(), xb.grad().clone(), torch::rand({8}));
  };
  const auto [plainGrads, plainA, plainB, plainAfter] = run(false);
  const auto [ckptGrads, ckptA, ckptB, ckptAfter] = run(true);
  expectSameGrads(ckptGrads, plainGrads);
  expectClose(ckptA, plainA, "micro-batch A's input gradient");
  expectClose(ckptB, plainB, "micro-batch B's input gradient");
  EXPECT_TRUE(torch::equal(ckptAfter, plainAfter));
}

TEST(ActivationCheckpoint, NestedCheckpointsGiveTheSameGradients) {
  torch::manual_seed(6);
  auto net = train::residualMlp(4, 32);
  net->push_back("drop", torch::nn::Dropout(0.25));
  const torch::Tensor images = torch::randn({4, 1, 28, 28});

  torch::manual_seed(10);
  auto x = images.clone().requires_grad_(true);
  lossOf(net->forward(x)).backward();
  const auto plain = grads(*net);
  const torch::Tensor plainInput = x.grad().clone();

  clearGrads(*net);
  torch::manual_seed(10);
  auto y = images.clone().requires_grad_(true);
  // An outer checkpoint whose function checkpoints every layer again.
  const torch::Tensor out = checkpoint(
      [&net](const torch::Tensor& t) { return forwardEachLayerCheckpointed(net, t); }, y);
  lossOf(out).backward();
  expectSameGrads(grads(*net), plain);
  expectClose(y.grad(), plainInput, "input gradient");
}

TEST(ActivationCheckpoint, AnOutputOutsideTheLossOrWithZeroGradientIsHarmless) {
  torch::manual_seed(7);
  torch::nn::Linear f(8, 8), g(8, 8);
  const torch::Tensor x = torch::randn({2, 8});
  auto fOf = [&f](const torch::Tensor& t) { return f(t); };
  auto gOf = [&g](const torch::Tensor& t) { return g(t); };

  // f's output is not used by the loss: its backward never runs.
  torch::Tensor unused = checkpoint(fOf, x);
  lossOf(checkpoint(gOf, x)).backward();
  EXPECT_FALSE(f->weight.grad().defined());
  EXPECT_TRUE(g->weight.grad().defined());

  // Used, but with a zero gradient: the recompute runs and f's gradients are zeros.
  (checkpoint(fOf, x) * 0).sum().backward();
  ASSERT_TRUE(f->weight.grad().defined());
  EXPECT_EQ(f->weight.grad().abs().sum().item<float>(), 0.0f);

  // A function with nothing needing a gradient, in a loss that has one elsewhere.
  torch::Tensor w = torch::ones({8}, torch::requires_grad());
  (checkpoint([](const torch::Tensor& t) { return torch::relu(t); }, x) * w).sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

TEST(ActivationCheckpoint, UnderNoGradTheFunctionSimplyRuns) {
  torch::nn::Linear f(4, 4);
  torch::NoGradGuard noGrad;
  const torch::Tensor x = torch::randn({2, 4});
  const torch::Tensor out = checkpoint([&f](const torch::Tensor& t) { return f(t); }, x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(torch::equal(out, f(x)));
}

// The error's text, or "" if none.
template <typename F>
std::string invalidArgumentOf(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ActivationCheckpoint, ARecomputeOfAnotherShapeOrDtypeIsNamed) {
  torch::nn::Linear f(6, 6);
  const torch::Tensor x = torch::randn({3, 6});
  int calls = 0;
  const torch::Tensor out = checkpoint(
      [&](const torch::Tensor& t) { return ++calls == 1 ? f(t) : f(t).narrow(1, 0, 4); }, x);
  std::string e = invalidArgumentOf([&] { lossOf(out).backward(); });
  EXPECT_NE(e.find("the recompute in backward returned [3, 4] Float but the forward returned "
                   "[3, 6] Float"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;

  calls = 0;
  const torch::Tensor out2 = checkpoint(
      [&](const torch::Tensor& t) { return ++calls == 1 ? f(t) : f(t).to(torch::kDouble); }, x);
  e = invalidArgumentOf([&] { lossOf(out2).backward(); });
  EXPECT_NE(e.find("returned [3, 6] Double but the forward returned [3, 6] Float"),
            std::string::npos)
      << e;
}

TEST(ActivationCheckpoint, MisuseIsAnInvalidArgument) {
  const torch::Tensor x = torch::randn({2, 2});
  auto identity = [](const torch::Tensor& t) { return t * 1; };
  EXPECT_NE(
      invalidArgumentOf([&] { checkpoint(identity, torch::Tensor()); }).find("undefined input"),
      std::string::npos);
  EXPECT_NE(
      invalidArgumentOf([&] { checkpoint(train::CheckpointFunction(), x); }).find("empty function"),
      std::string::npos);
  EXPECT_NE(invalidArgumentOf([&] {
              checkpoint([](const torch::Tensor&) { return torch::Tensor(); }, x);
            }).find("returned no tensor"),
            std::string::npos);
  EXPECT_NE(invalidArgumentOf([] { Checkpointed{torch::nn::Sequential(nullptr)}; }).find("null"),
            std::string::npos);
  EXPECT_NE(invalidArgumentOf([] { Checkpointed{torch::nn::AnyModule()}; }).find("no module"),
            std::string::npos);
}

// Bytes allocated through c10's CPU allocator on this thread while installed, minus those
// freed: the same hook the PyTorch profiler's profile_memory uses (DefaultCPUAllocator reports
// every allocation and free to the thread's PROFILER_STATE debug info).
class LiveBytes : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, int64_t, int64_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

struct ForwardMemory {
  int64_t kept = 0;  // still allocated after forward with the output held: the graph's saved
                     // activations plus the output
  int64_t peak = 0;  // the most allocated at once during forward
};

// The memory of one training forward of `forward` on `x`; backward then runs (outside the
// measurement) to check the graph is usable.
template <typename F>
ForwardMemory measureForward(F&& forward, const torch::Tensor& x) {
  ForwardMemory m;
  auto reporter = std::make_shared<LiveBytes>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    torch::Tensor out = forward(x);
    m.kept = reporter->live();
    m.peak = reporter->peak();
    torch::Tensor loss = lossOf(out);
    out = torch::Tensor();
    loss.backward();  // frees the graph's saved tensors while still measured
  }
  return m;
}

// The honest version of "checkpointing saves memory": what stays allocated after a forward
// with the output held, on a 16-block residual MLP (hidden 512, micro-batch 128). Plain
// autograd keeps, per block, the LayerNorm's output, the ReLU's output and the block's output
// (3 x 256 KiB); checkpointing each block keeps only the blocks' outputs (each the next block's
// saved input); checkpointing the whole stage keeps only its output. The bounds leave room for
// the small tensors (statistics, the stem) and would fail if checkpointing kept intermediates.
TEST(ActivationCheckpoint, KeepsMeasurablyLessMemoryAfterForward) {
  torch::manual_seed(8);
  auto net = train::residualMlp(16, 512);
  const torch::Tensor images = torch::randn({128, 1, 28, 28});
  const int64_t activation = 128 * 512 * static_cast<int64_t>(sizeof(float));

  const ForwardMemory plain =
      measureForward([&](const torch::Tensor& x) { return net->forward(x); }, images);
  clearGrads(*net);
  const ForwardMemory perBlock = measureForward(
      [&](const torch::Tensor& x) { return forwardEachLayerCheckpointed(net, x); }, images);
  clearGrads(*net);
  Checkpointed stage(net);
  const ForwardMemory whole =
      measureForward([&](const torch::Tensor& x) { return stage(x); }, images);

  std::printf(
      "[ memory   ] kept after forward: plain %.2f MiB, each layer checkpointed %.2f MiB "
      "(%.1f%%), whole model checkpointed %.3f MiB (%.2f%%); peak during forward: %.2f / "
      "%.2f / %.2f MiB\n",
      plain.kept / 1048576.0, perBlock.kept / 1048576.0, 100.0 * perBlock.kept / plain.kept,
      whole.kept / 1048576.0, 100.0 * whole.kept / plain.kept, plain.peak / 1048576.0,
      perBlock.peak / 1048576.0, whole.peak / 1048576.0);
  EXPECT_GE(plain.kept, 16 * 3 * activation) << "the measurement does not see the activations";
  EXPECT_LE(perBlock.kept, 16 * activation + 4 * activation);
  EXPECT_LE(perBlock.kept * 2, plain.kept);
  EXPECT_LE(whole.kept, activation);
}

}  // namespace
}  // namespace shoal::test
