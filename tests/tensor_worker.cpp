// One rank of the tensor-parallelism tests, run under `shoal run -n N`
// (tests/tensor_parallel_test.cpp).
//
//   layers   every tensor-parallel layer over the N ranks against the one-process computation
//            written with plain libtorch: forward outputs and every gradient (parameters and
//            input) within rtol 1e-5; prints "OK <layer>" or "FAIL <layer>: ..." per check
//   count    one transformer block's forward and backward: prints the number of all-reduces in
//            each ("COUNT forward f backward b allgathers g")
//   gpt D P T [schedule]
//            the GPT on a data D x pipeline P x tensor T grid: after 3 SGD steps every full
//            parameter (gathered) equals one-process training's on the same global batches
//            within rtol 1e-4, and so does every step's loss; prints "OK gpt ..." or "FAIL ..."
//   resume D P T DIR
//            4 Adam steps straight, and 2 steps + a sharded checkpoint in DIR + a new model and
//            optimizer resumed from it + 2 steps: the full parameters must be bitwise equal
//            ("OK resume ...")
//   precision D P T
//            the GPT on fortunes for 40 AdamW steps on the grid in bf16 and in fp16 (an inf
//            injected into one gradient of tensor rank T-1 at step 3) against one process in
//            fp32: both end within a margin of fp32's loss; in fp16 every rank skips step 3 only
//            and the scale halves ("OK bf16 ...", "OK fp16 ...")
//   export T PATH
//            a GPT trained 2 steps with tensor parallelism T is gathered and written to PATH; a
//            one-process model loaded from the file gives the same logits as the split model
//            ("OK export ..." on world rank 0)
//   dropout  ShardedDropout over the N ranks from one shared seed: every rank drops about p of
//            its slice, no two ranks draw the same mask, the shared stream stays in step
//            (the next draw equal on every rank), a replay of the seed draws the same mask,
//            evaluation mode is the identity ("OK dropout ..." per rank)
// Exit code 0 only if everything checked held.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "train/byte_corpus.h"
#include "train/gpt.h"
#include "train/hybrid_parallel.h"
#include "train/process_grid.h"
#include "train/tensor/attention.h"
#include "train/tensor/column_linear.h"
#include "train/tensor/mlp.h"
#include "train/tensor/regions.h"
#include "train/tensor/row_linear.h"
#include "train/tensor/sharded_dropout.h"
#include "train/tensor/vocab_cross_entropy.h"
#include "train/tensor/vocab_embedding.h"

namespace tp = shoal::train::tensor;

namespace {

struct Checker {
  int rank;
  int failures = 0;
  void operator()(const std::string& what, const torch::Tensor& got, const torch::Tensor& want) {
    std::string why;
    if (!got.defined() || !want.defined()) {
      why = "undefined tensor";
    } else if (got.sizes() != want.sizes()) {
      why = fmt::format("shape {} vs {}", c10::str(got.sizes()), c10::str(want.sizes()));
    } else {
      // Relative to the tensor's scale: float sums in another order (a slice's partial products
      // all-reduced instead of one matmul) differ by rounding, most visibly in elements near 0.
      const double diff = (got - want).abs().max().item<double>();
      const double scale = std::max(want.abs().max().item<double>(), 1e-30);
      if (diff > 1e-5 * scale)
        why = fmt::format("max difference {:.3g} (scale {:.3g})", diff, scale);
    }
    if (why.empty()) {
      std::cout << fmt::format("OK {}\n", what);
    } else {
      ++failures;
      std::cout << fmt::format("FAIL {}: {}\n", what, why);
    }
  }
};

torch::Tensor leaf(torch::Tensor t) {
  return t.detach().clone().requires_grad_(true);
}

// Sum of out * weights: a loss whose gradient is `weights` (not all ones, so a transposed or
// misplaced slice shows).
torch::Tensor probe(const torch::Tensor& out, const torch::Tensor& weights) {
  return (out * weights).sum();
}

int layers(const shoal::World& world) {
  tp::TensorGroup tg{world.group};
  const int r = tg.rank(), n = tg.size();
  Checker check{world.rank};
  torch::manual_seed(7);  // the same full tensors on every rank
  const int64_t b = 2, s = 5, hidden = 48, heads = 12, inner = 96, vocab = 10;
  torch::Tensor x = torch::randn({b, s, hidden});

  // Column-parallel, output gathered and left split; fused blocks.
  for (int blocks : {1, 3}) {
    for (bool gather : {true, false}) {
      const std::string name = fmt::format("column blocks {} gather {}", blocks, gather);
      torch::Tensor w = torch::randn({blocks * inner, hidden}),
                    bias = torch::randn({blocks * inner});
      torch::Tensor refW = leaf(w), refB = leaf(bias), refX = leaf(x);
      torch::Tensor refOut = torch::nn::functional::linear(refX, refW, refB);
      torch::Tensor gradOut = torch::randn(refOut.sizes());
      probe(refOut, gradOut).backward();

      tp::ColumnParallelLinear layer(w, bias, tg,
                                     tp::ColumnOptions{.gatherOutput = gather, .blocks = blocks});
      torch::Tensor px = leaf(x);
      torch::Tensor out = layer->forward(px);
      const tp::Slice sl = layer->blockSlice();
      torch::Tensor wantOut =
          gather ? refOut
                 : tp::sliceBlocks(refOut.detach().transpose(0, 2), blocks, sl).transpose(0, 2);
      check(name + " output", out.detach(), wantOut.detach());
      probe(out,
            gather ? gradOut : tp::sliceBlocks(gradOut.transpose(0, 2), blocks, sl).transpose(0, 2))
          .backward();
      check(name + " weight grad", layer->weight.grad(), tp::sliceBlocks(refW.grad(), blocks, sl));
      check(name + " bias grad", layer->bias.grad(), tp::sliceBlocks(refB.grad(), blocks, sl));
      check(name + " input grad", px.grad(), refX.grad());
      auto full = layer->gatherFull();
      check(name + " gathered weight", full[0].second, w);
      check(name + " gathered bias", full[1].second, bias);
    }
  }

  // Row-parallel, input already split and split here.
  for (bool parallelInput : {true, false}) {
    const std::string name = fmt::format("row parallel input {}", parallelInput);
    torch::Tensor w = torch::randn({hidden, inner}), bias = torch::randn({hidden});
    torch::Tensor in = torch::randn({b, s, inner});
    torch::Tensor refW = leaf(w), refB = leaf(bias), refX = leaf(in);
    torch::Tensor refOut = torch::nn::functional::linear(refX, refW, refB);
    torch::Tensor gradOut = torch::randn(refOut.sizes());
    probe(refOut, gradOut).backward();

    tp::RowParallelLinear layer(w, bias, tg, tp::RowOptions{.inputIsParallel = parallelInput});
    const tp::Slice sl = tp::sliceOf(inner, r, n);
    torch::Tensor px = leaf(parallelInput ? in.narrow(-1, sl.begin, sl.size) : in);
    torch::Tensor out = layer->forward(px);
    check(name + " output", out.detach(), refOut.detach());
    probe(out, gradOut).backward();
    check(name + " weight grad", layer->weight.grad(), refW.grad().narrow(1, sl.begin, sl.size));
    check(name + " bias grad", layer->bias.grad(), refB.grad());
    check(name + " input grad", px.grad(),
          parallelInput ? refX.grad().narrow(-1, sl.begin, sl.size) : refX.grad());
    check(name + " gathered weight", layer->gatherFull()[0].second, w);
  }

  // Vocabulary-parallel embedding (the vocabulary need not divide).
  {
    torch::Tensor w = torch::randn({vocab, hidden});
    torch::Tensor ids = torch::randint(vocab, {b, s});
    torch::Tensor refW = leaf(w);
    torch::Tensor refOut = torch::embedding(refW, ids);
    torch::Tensor gradOut = torch::randn(refOut.sizes());
    probe(refOut, gradOut).backward();
    tp::VocabParallelEmbedding layer(w, tg);
    torch::Tensor out = layer->forward(ids);
    check("embedding output", out.detach(), refOut.detach());
    probe(out, gradOut).backward();
    const tp::Slice sl = layer->vocabSlice();
    check("embedding weight grad", layer->weight.grad(), refW.grad().narrow(0, sl.begin, sl.size));
    check("embedding gathered weight", layer->gatherFull()[0].second, w);
  }

  // Vocabulary-parallel cross-entropy against libtorch's, on full logits.
  {
    torch::Tensor logits = torch::randn({b, s, vocab}) * 4;
    torch::Tensor targets = torch::randint(vocab, {b, s});
    torch::Tensor refL = leaf(logits);
    torch::Tensor refLoss =
        torch::nn::functional::cross_entropy(refL.view({-1, vocab}), targets.view({-1}));
    refLoss.backward();
    const tp::Slice sl = tp::sliceOf(vocab, r, n);
    torch::Tensor local = leaf(logits.narrow(-1, sl.begin, sl.size));
    torch::Tensor loss = tp::vocabParallelCrossEntropy(local, targets, sl.begin, tg).mean();
    check("cross-entropy loss", loss.detach(), refLoss.detach());
    loss.backward();
    check("cross-entropy logits grad", local.grad(), refL.grad().narrow(-1, sl.begin, sl.size));
  }

  // Attention: plain libtorch reference (fused projection, per-head causal attention).
  {
    tp::AttentionWeights w{torch::randn({3 * hidden, hidden}) * 0.2, torch::randn({3 * hidden}),
                           torch::randn({hidden, hidden}) * 0.2, torch::randn({hidden})};
    torch::Tensor qkvW = leaf(w.qkvWeight), qkvB = leaf(w.qkvBias), pW = leaf(w.projWeight),
                  pB = leaf(w.projBias), refX = leaf(x);
    auto qkv = torch::nn::functional::linear(refX, qkvW, qkvB).chunk(3, -1);
    const int64_t d = hidden / heads;
    auto heads4 = [&](const torch::Tensor& t) { return t.view({b, s, heads, d}).transpose(1, 2); };
    torch::Tensor scores =
        torch::matmul(heads4(qkv[0]), heads4(qkv[1]).transpose(-2, -1)) / std::sqrt(double(d));
    scores = scores + torch::full({s, s}, -1e30).triu(1);
    torch::Tensor ctx = torch::matmul(torch::softmax(scores, -1), heads4(qkv[2]));
    torch::Tensor refOut =
        torch::nn::functional::linear(ctx.transpose(1, 2).reshape({b, s, hidden}), pW, pB);
    torch::Tensor gradOut = torch::randn(refOut.sizes());
    probe(refOut, gradOut).backward();

    tp::ParallelSelfAttention layer(w, heads, tg);
    torch::Tensor px = leaf(x);
    torch::Tensor out = layer->forward(px);
    check("attention output", out.detach(), refOut.detach());
    probe(out, gradOut).backward();
    const tp::Slice sl = layer->qkv->blockSlice();
    check("attention qkv weight grad", layer->qkv->weight.grad(),
          tp::sliceBlocks(qkvW.grad(), 3, sl));
    check("attention qkv bias grad", layer->qkv->bias.grad(), tp::sliceBlocks(qkvB.grad(), 3, sl));
    check("attention proj weight grad", layer->proj->weight.grad(),
          pW.grad().narrow(1, sl.begin, sl.size));
    check("attention proj bias grad", layer->proj->bias.grad(), pB.grad());
    check("attention input grad", px.grad(), refX.grad());
  }

  // MLP: fc2(gelu(fc1(x))).
  {
    tp::MlpWeights w{torch::randn({inner, hidden}) * 0.2, torch::randn({inner}),
                     torch::randn({hidden, inner}) * 0.2, torch::randn({hidden})};
    torch::Tensor w1 = leaf(w.fc1Weight), b1 = leaf(w.fc1Bias), w2 = leaf(w.fc2Weight),
                  b2 = leaf(w.fc2Bias), refX = leaf(x);
    torch::Tensor refOut = torch::nn::functional::linear(
        torch::gelu(torch::nn::functional::linear(refX, w1, b1)), w2, b2);
    torch::Tensor gradOut = torch::randn(refOut.sizes());
    probe(refOut, gradOut).backward();
    tp::ParallelMlp layer(w, tg);
    torch::Tensor px = leaf(x);
    torch::Tensor out = layer->forward(px);
    check("mlp output", out.detach(), refOut.detach());
    probe(out, gradOut).backward();
    const tp::Slice sl = tp::sliceOf(inner, r, n);
    check("mlp fc1 weight grad", layer->fc1->weight.grad(), w1.grad().narrow(0, sl.begin, sl.size));
    check("mlp fc1 bias grad", layer->fc1->bias.grad(), b1.grad().narrow(0, sl.begin, sl.size));
    check("mlp fc2 weight grad", layer->fc2->weight.grad(), w2.grad().narrow(1, sl.begin, sl.size));
    check("mlp fc2 bias grad", layer->fc2->bias.grad(), b2.grad());
    check("mlp input grad", px.grad(), refX.grad());
  }
  std::cout << fmt::format("DONE failures {}\n", check.failures) << std::flush;
  return check.failures == 0 ? 0 : 1;
}

// Megatron's count: a block costs two all-reduces forward and two backward, whatever the size.
int count(const shoal::World& world) {
  tp::TensorGroup tg{world.group};
  shoal::train::GptConfig c{.vocabulary = 16, .sequence = 8, .hidden = 32, .heads = 4, .layers = 1};
  auto net = shoal::train::makeGpt(c, tg);
  auto block = net[1];
  torch::Tensor x = torch::randn({2, 8, 32}, torch::requires_grad());
  tg.counters->reset();
  torch::Tensor out = net->ptr(1)->as<shoal::train::GptBlock>()->forward(x);
  const auto fwd = *tg.counters;
  out.sum().backward();
  const auto all = *tg.counters;
  std::cout << fmt::format("COUNT forward {} backward {} allgathers {} (forward pass: {} {})\n",
                           all.forwardAllreduces, all.backwardAllreduces, all.allgathers,
                           fwd.forwardAllreduces, fwd.backwardAllreduces)
            << std::flush;
  return 0;
}

// Float sums in another order (slices all-reduced, micro-batches accumulated, replicas averaged)
// differ by rounding, which a few steps of training amplify: 1e-4 relative to each tensor's
// scale is the bound (the layer tests hold 1e-5).
int gpt(const shoal::World& world, int data, int pipelineStages, int tensorSize,
        const std::string& schedule) {
  namespace st = shoal::train;
  st::ProcessGrid grid = st::makeProcessGrid(
      world.group, {.data = data, .pipeline = pipelineStages, .tensor = tensorSize});
  const st::GptConfig c{.vocabulary = 23,
                        .sequence = 8,
                        .hidden = 16,
                        .heads = 4,
                        .layers = 2,
                        .inner = 32,
                        .seed = 3};
  const int64_t batch = 8;
  auto batchAt = [&](int step) {
    torch::Tensor t = torch::randint(c.vocabulary, {batch, c.sequence + 1},
                                     at::detail::createCPUGenerator(100 + step));
    return std::pair{t.narrow(1, 0, c.sequence).contiguous(),
                     t.narrow(1, 1, c.sequence).contiguous()};
  };
  const int steps = 3;
  const double lr = 0.5;

  // One process: the same model, the whole batch.
  st::tensor::TensorGroup one;
  auto ref = st::makeGpt(c, one);
  torch::optim::SGD refOpt(ref->parameters(), lr);
  std::vector<double> refLoss;
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = batchAt(i);
    refOpt.zero_grad();
    torch::Tensor l = st::gptLoss(ref->forward(x), y, c, one);
    l.backward();
    refOpt.step();
    refLoss.push_back(l.item<double>());
  }

  st::tensor::TensorGroup tg{grid.tensor};
  auto net = st::makeGpt(c, tg);
  auto [x0, y0] = batchAt(0);
  st::HybridOptions options;
  options.pipeline.schedule = schedule;
  options.pipeline.microBatches = 2;
  options.pipeline.chunks = schedule == "interleaved" ? 2 : 1;
  options.pipeline.split = shoal::train::pipeline::SplitMethod::kParameters;
  options.pipeline.printPlan = false;
  st::HybridParallel model(
      net, grid, x0.narrow(0, 0, batch / data / 2),
      [&](const torch::Tensor& out, const torch::Tensor& target) {
        return st::gptLoss(out, target, c, tg);
      },
      options);
  torch::optim::SGD opt(model.parameters(), lr);
  Checker check{world.rank};
  const std::string name = fmt::format("gpt data {} pipeline {} tensor {} {}", data, pipelineStages,
                                       tensorSize, schedule);
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = batchAt(i);
    opt.zero_grad();
    const double loss = model.step(x, y);
    opt.step();
    check(fmt::format("{} loss at step {}", name, i), torch::tensor(loss),
          torch::tensor(refLoss[i]));
  }
  std::map<std::string, torch::Tensor> want;
  for (const auto& p : ref->named_parameters()) want[p.key()] = p.value().detach();
  st::FullState got = model.gatherFullState();
  if (got.size() != want.size()) {
    ++check.failures;
    std::cout << fmt::format("FAIL {}: {} gathered tensors, the model has {}\n", name, got.size(),
                             want.size());
  }
  int64_t bad = 0;
  for (const auto& [key, t] : got) {
    const double diff = (t - want.at(key)).abs().max().item<double>();
    const double scale = want.at(key).abs().max().item<double>();
    if (diff > 1e-4 * scale) {
      ++bad;
      std::cout << fmt::format("FAIL {}: {} differs by {:.3g} (scale {:.3g})\n", name, key, diff,
                               scale);
    }
  }
  check.failures += bad;
  if (check.failures == 0)
    std::cout << fmt::format("OK {}: {} parameters equal\n", name, got.size());
  std::cout << std::flush;
  return check.failures == 0 ? 0 : 1;
}

int resume(const shoal::World& world, int data, int pipelineStages, int tensorSize,
           const std::string& dir) {
  namespace st = shoal::train;
  st::ProcessGrid grid = st::makeProcessGrid(
      world.group, {.data = data, .pipeline = pipelineStages, .tensor = tensorSize});
  const st::GptConfig c{
      .vocabulary = 19, .sequence = 6, .hidden = 16, .heads = 4, .layers = 2, .seed = 8};
  st::tensor::TensorGroup tg{grid.tensor};
  auto batchAt = [&](int step) {
    torch::Tensor t = torch::randint(c.vocabulary, {8, c.sequence + 1},
                                     at::detail::createCPUGenerator(300 + step));
    return std::pair{t.narrow(1, 0, c.sequence), t.narrow(1, 1, c.sequence)};
  };
  st::HybridOptions options;
  options.pipeline.microBatches = 2;
  options.pipeline.split = shoal::train::pipeline::SplitMethod::kParameters;
  options.pipeline.printPlan = false;
  // A fresh model and optimizer trained over steps [from, to), resumed from `dir` first if asked,
  // checkpointed at the end if asked; returns the full parameters.
  auto run = [&](int from, int to, bool resumeFirst, bool saveAtEnd) {
    auto net = st::makeGpt(c, tg);
    st::HybridParallel model(
        net, grid, batchAt(0).first.narrow(0, 0, 8 / data / 2),
        [&](const torch::Tensor& out, const torch::Tensor& target) {
          return st::gptLoss(out, target, c, tg);
        },
        options);
    torch::optim::Adam opt(model.parameters(), 0.01);
    auto ckpt = model.checkpointer(dir, 2);
    if (resumeFirst) {
      auto progress = ckpt->resumeLatest(opt);
      SHOAL_CHECK(progress && progress->step == from, "resumed at {}, expected {}",
                  progress ? progress->step : -1, from);
    }
    for (int i = from; i < to; ++i) {
      auto [x, y] = batchAt(i);
      opt.zero_grad();
      model.step(x, y);
      opt.step();
    }
    if (saveAtEnd) ckpt->save(opt, {.step = to});
    return model.gatherFullState();
  };
  st::FullState straight = run(0, 4, false, false);
  run(0, 2, false, true);
  st::FullState resumed = run(2, 4, true, false);
  int bad = 0;
  for (size_t i = 0; i < straight.size(); ++i) {
    if (straight[i].first != resumed[i].first || !straight[i].second.equal(resumed[i].second)) {
      ++bad;
      std::cout << fmt::format("FAIL resume: {} differs\n", straight[i].first);
    }
  }
  if (bad == 0) {
    std::cout << fmt::format(
        "OK resume data {} pipeline {} tensor {}: {} parameters bitwise equal\n", data,
        pipelineStages, tensorSize, straight.size());
  }
  return bad == 0 ? 0 : 1;
}

int precision(const shoal::World& world, int data, int pipelineStages, int tensorSize) {
  namespace st = shoal::train;
  st::ProcessGrid grid = st::makeProcessGrid(
      world.group, {.data = data, .pipeline = pipelineStages, .tensor = tensorSize});
  const st::GptConfig c{
      .vocabulary = 256, .sequence = 16, .hidden = 32, .heads = 4, .layers = 2, .seed = 4};
  st::ByteCorpus corpus;
  const int steps = 40, injectAt = 3;
  const int64_t batch = 16;
  // Mean loss of the last 10 steps.
  auto train = [&](st::Precision precision, const st::tensor::TensorGroup& tg,
                   const st::ProcessGrid& g, std::vector<int>* skipped) {
    auto net = st::makeGpt(c, tg);
    st::HybridOptions options;
    options.precision = precision;
    options.pipeline.microBatches = 2;
    options.pipeline.split = shoal::train::pipeline::SplitMethod::kParameters;
    options.pipeline.printPlan = false;
    auto first = corpus.batch(batch, c.sequence, 0, st::ByteCorpus::Split::kTrain);
    st::HybridParallel model(
        net, g, first.narrow(0, 0, batch / g.dataSize / 2).narrow(1, 0, c.sequence),
        [&](const torch::Tensor& out, const torch::Tensor& target) {
          return st::gptLoss(out, target, c, tg);
        },
        options);
    torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(3e-3));
    double tail = 0;
    for (int i = 0; i < steps; ++i) {
      auto b = corpus.batch(batch, c.sequence, i, st::ByteCorpus::Split::kTrain);
      opt.zero_grad();
      const double loss = model.step(b.narrow(1, 0, c.sequence), b.narrow(1, 1, c.sequence));
      if (skipped && i == injectAt && g.tensorRank == g.tensorSize - 1) {
        torch::NoGradGuard noGrad;
        model.parameters()[0].grad().view(-1)[0] = std::numeric_limits<float>::infinity();
      }
      if (!model.optimizerStep(opt) && skipped) skipped->push_back(i);
      if (i >= steps - 10) tail += loss / 10;
    }
    return std::pair{tail, model.scaler().currentScale()};
  };
  st::ProcessGrid alone = st::makeProcessGrid(world.group->split(world.rank, 0), {});
  const double fp32 = train(st::Precision::kFloat32, {}, alone, nullptr).first;
  st::tensor::TensorGroup tg{grid.tensor};
  const double bf16 = train(st::Precision::kBFloat16, tg, grid, nullptr).first;
  std::vector<int> skipped;
  auto [fp16, scale] = train(st::Precision::kFloat16, tg, grid, &skipped);
  const std::string where =
      fmt::format("data {} pipeline {} tensor {}", data, pipelineStages, tensorSize);
  // Margins: measured differences were below 0.01 (bf16) and 0.02 (fp16) on this model.
  int failures = 0;
  auto report = [&](bool ok, const std::string& what) {
    failures += ok ? 0 : 1;
    std::cout << (ok ? "OK " : "FAIL ") << what << "\n";
  };
  report(std::abs(bf16 - fp32) < 0.05,
         fmt::format("bf16 {}: loss {:.4f}, fp32 one process {:.4f}", where, bf16, fp32));
  report(std::abs(fp16 - fp32) < 0.1 && skipped == std::vector<int>{injectAt} && scale == 32768.0,
         fmt::format("fp16 {}: loss {:.4f}, fp32 one process {:.4f}; skipped steps [{}], scale {}",
                     where, fp16, fp32, fmt::join(skipped, ","), scale));
  std::cout << std::flush;
  return failures == 0 ? 0 : 1;
}

int exportModel(const shoal::World& world, int tensorSize, const std::string& path) {
  namespace st = shoal::train;
  st::ProcessGrid grid = st::makeProcessGrid(world.group, {.tensor = tensorSize});
  const st::GptConfig c{
      .vocabulary = 29, .sequence = 8, .hidden = 24, .heads = 6, .layers = 2, .seed = 5};
  st::tensor::TensorGroup tg{grid.tensor};
  auto net = st::makeGpt(c, tg);
  st::HybridParallel model(net, grid, torch::Tensor(),
                           [&](const torch::Tensor& out, const torch::Tensor& target) {
                             return st::gptLoss(out, target, c, tg);
                           });
  torch::optim::Adam opt(model.parameters(), 0.01);
  auto gen = at::detail::createCPUGenerator(9);
  for (int i = 0; i < 2; ++i) {
    torch::Tensor t = torch::randint(c.vocabulary, {4, c.sequence + 1}, gen);
    opt.zero_grad();
    model.step(t.narrow(1, 0, c.sequence), t.narrow(1, 1, c.sequence));
    opt.step();
  }
  torch::Tensor probeTokens = torch::randint(c.vocabulary, {3, c.sequence}, gen);
  torch::NoGradGuard noGrad;
  torch::Tensor logits = st::gatherLogits(net->forward(probeTokens), c, tg);
  st::FullState state = model.gatherFullState();
  if (world.rank == 0) st::writeFullState(path, state);
  shoal::comm::barrier(*world.group);

  auto one = st::makeGpt({.vocabulary = c.vocabulary,
                          .sequence = c.sequence,
                          .hidden = c.hidden,
                          .heads = c.heads,
                          .layers = c.layers,
                          .seed = 77},
                         st::tensor::TensorGroup{});
  st::loadFullState(*one, st::readFullState(path));
  Checker check{world.rank};
  check(fmt::format("export tensor {}: one-process logits from {}", tensorSize, path),
        one->forward(probeTokens), logits);
  return check.failures == 0 ? 0 : 1;
}

// Every rank's row of `mine` (same shape everywhere), gathered over the world.
torch::Tensor gatherRows(shoal::World& world, const torch::Tensor& mine) {
  const torch::Tensor flat = mine.to(torch::kFloat).contiguous().reshape({-1});
  torch::Tensor all = torch::empty({world.size, flat.numel()}, torch::kFloat);
  shoal::comm::allgather(*world.group, flat.data_ptr(), all.data_ptr(),
                         static_cast<size_t>(flat.numel()), shoal::DataType::kFloat32);
  return all;
}

int dropout(shoal::World& world) {
  const double p = 0.3;
  tp::ShardedDropout drop(p, tp::TensorGroup{world.group});
  const torch::Tensor x = torch::ones({8192});
  torch::manual_seed(42);  // the shared stream, the same on every rank (as the Trainer seeds it)
  const torch::Tensor kept = drop(x).ne(0);
  const torch::Tensor next = torch::rand({4});
  torch::manual_seed(42);
  const torch::Tensor replay = drop(x).ne(0);
  int failures = 0;
  const auto expect = [&](bool ok, const std::string& what) {
    fmt::print("{} dropout: {}\n", ok ? "OK" : "FAIL", what);
    failures += ok ? 0 : 1;
  };
  const double dropped = 1 - kept.to(torch::kFloat).mean().item<double>();
  expect(std::abs(dropped - p) < 0.03,
         fmt::format("dropped {:.3f} of the slice (p {})", dropped, p));
  const torch::Tensor y = drop(x);
  const torch::Tensor scaled = y.masked_select(y.ne(0));
  expect(scaled.numel() > 0 && (scaled - 1 / (1 - p)).abs().max().item<double>() < 1e-6,
         "kept elements scaled by 1 / (1 - p)");
  expect(replay.equal(kept), "a replay of the shared seed draws the same mask");
  const torch::Tensor masks = gatherRows(world, kept);
  const torch::Tensor draws = gatherRows(world, next);
  for (int r = 0; r < world.size; ++r) {
    expect(draws[r].equal(draws[world.rank]),
           fmt::format("the shared stream in step with rank {}", r));
    if (r == world.rank) continue;
    // Independent masks agree on (1-p)^2 + p^2 = 0.58 of the elements; identical ones on all.
    const double agree = masks[r].eq(masks[world.rank]).to(torch::kFloat).mean().item<double>();
    expect(agree < 0.65, fmt::format("mask against rank {}'s agrees on {:.3f}", r, agree));
  }
  drop->eval();
  expect(drop(x).equal(x), "the identity in evaluation mode");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    const std::string mode = argc > 1 ? argv[1] : "layers";
    shoal::World world = shoal::init();
    if (mode == "layers") return layers(world);
    if (mode == "count") return count(world);
    if (mode == "dropout") return dropout(world);
    if (mode == "resume" && argc >= 6) {
      return resume(world, std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
    }
    if (mode == "precision" && argc >= 5) {
      return precision(world, std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]));
    }
    if (mode == "export" && argc >= 4) return exportModel(world, std::stoi(argv[2]), argv[3]);
    if (mode == "gpt" && argc >= 5) {
      return gpt(world, std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]),
                 argc > 5 ? argv[5] : "1f1b");
    }
    SHOAL_THROW(InvalidArgument, "unknown mode {}", mode);
  } catch (const shoal::Error& e) {
    std::cerr << "ERROR " << shoal::test::typeName(e) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR " << e.what() << "\n";
    return 1;
  }
}
