// The gradient-compression benchmark's program (bench/run_compression.py runs it on an emulated
// slow network beside PyTorch's DDP hooks, bench/pytorch_compression.py). One rank of a Shoal job
// trains a wide MLP on Fashion-MNIST (784 - hidden - hidden - 10 with ReLUs; hidden 3072: 11.9 M
// parameters) with DistributedDataParallel, its gradients synchronized through
// ddp::compressionHook(--compression) (train/ddp/compression_hook.h), plain SGD with momentum at
// a constant rate, --batch samples per rank and step from a DistributedSampler shard:
//     build/shoal run -n 4 -- build/bench/compression_train --compression powersgd:4,warmup=10
// A spec with momentum (topk:0.01,momentum=0.9: the hook applies it) needs --momentum 0.
//
// Every --eval-every steps (and after the last) training pauses: the 10k test images are
// classified, each rank a contiguous quarter of them (all ranks' cores work on it; the counts
// are summed), and rank 0's decision to stop (the step or time budget) travels in the same
// reduction, so every rank stops after the same step. The clock runs only while training: it
// starts after a barrier, stops before each evaluation and restarts after the next barrier, so
// evaluation is never counted. The run ends after --max-steps steps, at the first evaluation
// after --max-seconds of training (checked there only: the ranks must agree on the step), or
// with --stop-at-target at the first evaluation at or above the target once --min-steps steps
// are done (step --min-steps is always evaluated, so runs can be compared at that step).
//
// Rank 0 prints ONE JSON line:
//   impl "shoal", spec (the canonical text), ranks, params, steps,
//   median_step_seconds   rank 0's wall time per step, median over the steps after the
//                         warm-up (the first step, which builds the buckets, never counts)
//   bytes_per_step        rank 0's DistributedDataParallel::stats().bytesSent over the
//                         training (evaluations excluded) / steps, warm-up steps included
//   bytes_per_step_compressed   the same over the steps after the warm-up only
//   link_bytes_per_step   bytes the network interfaces of rank 0's host sent (/proc/net/dev,
//                         loopback excluded: on the emulated network, what crosses its link,
//                         every rank of the host and the TCP/IP headers included) / steps
//   train_seconds, seconds_to_target (training time until the first evaluation at or above
//   --target-accuracy; null if none was), steps_to_target, final_accuracy and final_loss (the
//   test set's accuracy and mean cross-entropy after the last step), train_loss (rank 0's mean
//   training loss over the last --eval-every steps), evals ([step, training seconds, accuracy]
//   at every evaluation).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/fashion_mlp.h"
#include "comm/collectives.h"
#include "comm/compress/spec.h"
#include "common/error.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/distributed_sampler.h"
#include "train/idx_dataset.h"
#include "train/optim.h"

using namespace shoal;
using bench::Clock;
using bench::linkBytesSent;
using bench::makeMlp;
using bench::median;
using bench::seconds;

namespace {

struct Options {
  std::string compression = "none";
  double targetAccuracy = 0.78;
  int64_t evalEvery = 5;
  double maxSeconds = 600;
  int64_t maxSteps = 100;
  bool stopAtTarget = false;
  int64_t minSteps = 0;
  double lr = 0.01, momentum = 0.9;
  uint64_t seed = 1;
  int64_t batch = 64, hidden = 3072;
};

// Counters of the training so far, the evaluations left out.
struct Meter {
  double trainSeconds = 0;
  uint64_t bytes = 0, linkBytes = 0;
  Clock::time_point start;
  uint64_t bytesAtStart = 0, linkAtStart = 0;

  void resume(const train::DistributedDataParallel& ddp) {
    start = Clock::now();
    bytesAtStart = ddp.stats().bytesSent;
    linkAtStart = linkBytesSent();
  }
  // The totals as if paused now (without pausing).
  Meter current(const train::DistributedDataParallel& ddp) const {
    Meter m = *this;
    m.trainSeconds += seconds(start);
    m.bytes += ddp.stats().bytesSent - bytesAtStart;
    m.linkBytes += linkBytesSent() - linkAtStart;
    return m;
  }
};

int trainMlp(const World& world, const Options& o) {
  const auto spec = compress::CompressionSpec::parse(o.compression);
  SHOAL_CHECK(spec.momentum == 0 || o.momentum == 0,
              "--compression {} applies the momentum itself; the optimizer's would apply it twice "
              "(pass --momentum 0, not {})",
              spec.toString(), o.momentum);
  torch::manual_seed(o.seed);  // the same initial model on every rank
  auto trainSet = train::readIdxDataset(train::kFashionMnistDir, "train");
  auto testSet = train::readIdxDataset(train::kFashionMnistDir, "t10k");
  auto net = makeMlp(o.hidden);
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();

  train::DdpOptions d;
  d.commHook = train::ddp::compressionHook(spec);
  train::DistributedDataParallel ddp(net.ptr(), world.group, d);
  auto opt =
      train::makeOptimizer(net->parameters(), {train::OptimizerKind::kSgd, o.lr, o.momentum});
  train::DistributedSampler sampler(trainSet.size(), world.rank, world.size, {.seed = o.seed});
  const int64_t perEpoch = sampler.batches(o.batch);

  // This rank's contiguous share of the test set.
  const int64_t n = testSet.size();
  const int64_t lo = n * world.rank / world.size, hi = n * (world.rank + 1) / world.size;

  std::vector<double> stepSeconds, lossWindow;
  std::vector<std::array<double, 3>> evals;
  std::optional<double> toTarget;
  int64_t stepsToTarget = -1;
  double accuracy = 0, testLoss = 0;
  std::optional<Meter> atWarmup;
  std::vector<int64_t> order;
  torch::Tensor idxAll;
  int64_t epoch = -1, step = 0;

  Meter meter;
  comm::barrier(*world.group);
  meter.resume(ddp);
  for (bool stop = false; !stop;) {
    const int64_t b = step % perEpoch;
    if (b == 0) {
      order = sampler.indices(++epoch);
      idxAll = torch::from_blob(order.data(), {static_cast<int64_t>(order.size())}, torch::kInt64);
    }
    auto idx = idxAll.slice(0, b * o.batch, std::min<int64_t>((b + 1) * o.batch, order.size()));
    const auto t0 = Clock::now();
    opt->zero_grad();
    ddp.beforeForward();
    auto x = trainSet.images.index_select(0, idx).view({-1, 784});
    auto loss =
        torch::nn::functional::cross_entropy(net->forward(x), trainSet.labels.index_select(0, idx));
    ddp.backward(loss);
    opt->step();
    stepSeconds.push_back(seconds(t0));
    lossWindow.push_back(loss.item<double>());
    ++step;
    if (step == spec.warmupSteps) atWarmup = meter.current(ddp);
    if (step % o.evalEvery != 0 && step < o.maxSteps && step != o.minSteps) continue;

    meter = meter.current(ddp);
    torch::NoGradGuard noGrad;
    net->eval();
    // correct, summed loss, rank 0's vote to stop
    double sums[3] = {0, 0, 0};
    for (int64_t at = lo; at < hi; at += 1000) {
      auto xs = testSet.images.slice(0, at, std::min(at + 1000, hi)).view({-1, 784});
      auto ys = testSet.labels.slice(0, at, std::min(at + 1000, hi));
      auto out = net->forward(xs);
      sums[0] += out.argmax(1).eq(ys).sum().item<double>();
      sums[1] +=
          torch::nn::functional::cross_entropy(
              out, ys, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
    }
    if (world.rank == 0) sums[2] = step >= o.maxSteps || meter.trainSeconds >= o.maxSeconds;
    comm::allreduce(*world.group, sums, 3, DataType::kFloat64, ReduceOp::kSum);
    net->train();
    accuracy = sums[0] / static_cast<double>(n);
    testLoss = sums[1] / static_cast<double>(n);
    evals.push_back({static_cast<double>(step), meter.trainSeconds, accuracy});
    if (!toTarget && accuracy >= o.targetAccuracy) {
      toTarget = meter.trainSeconds;
      stepsToTarget = step;
    }
    // Every rank has the same sums, so decides the same.
    stop = sums[2] > 0 || (o.stopAtTarget && toTarget && step >= o.minSteps);
    if (!stop) {
      lossWindow.clear();
      comm::barrier(*world.group);
      meter.resume(ddp);
    }
  }

  if (world.rank == 0) {
    const size_t skip = std::max<int64_t>(spec.warmupSteps, 1);
    std::vector<double> steady(stepSeconds.begin() + std::min(skip, stepSeconds.size() - 1),
                               stepSeconds.end());
    double trainLoss = 0;
    for (double l : lossWindow) trainLoss += l / static_cast<double>(lossWindow.size());
    const double steps = static_cast<double>(step);
    nlohmann::json row{{"impl", "shoal"},
                       {"spec", spec.toString()},
                       {"ranks", world.size},
                       {"params", params},
                       {"batch", o.batch},
                       {"lr", o.lr},
                       {"momentum", o.momentum},
                       {"steps", step},
                       {"median_step_seconds", median(steady)},
                       {"bytes_per_step", static_cast<double>(meter.bytes) / steps},
                       {"link_bytes_per_step", static_cast<double>(meter.linkBytes) / steps},
                       {"train_seconds", meter.trainSeconds},
                       {"target_accuracy", o.targetAccuracy},
                       {"seconds_to_target", toTarget ? nlohmann::json(*toTarget) : nullptr},
                       {"steps_to_target", toTarget ? nlohmann::json(stepsToTarget) : nullptr},
                       {"final_accuracy", accuracy},
                       {"final_loss", testLoss},
                       {"train_loss", trainLoss},
                       {"evals", evals}};
    if (atWarmup && step > spec.warmupSteps) {
      row["bytes_per_step_compressed"] = static_cast<double>(meter.bytes - atWarmup->bytes) /
                                         static_cast<double>(step - spec.warmupSteps);
    } else if (!spec.enabled() || spec.warmupSteps == 0) {
      row["bytes_per_step_compressed"] = row["bytes_per_step"];
    }
    std::printf("%s\n", row.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the compression benchmark's training loop (a rank of `shoal run`)"};
  Options o;
  app.add_option("--compression", o.compression,
                 "none | fp16 | bf16 | topk:D | powersgd:R | onebit [,momentum=M] [,warmup=N]");
  app.add_option("--target-accuracy", o.targetAccuracy, "test accuracy that counts as reached")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--eval-every", o.evalEvery, "steps between evaluations")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--max-seconds", o.maxSeconds,
                 "stop at the first evaluation after this much training time")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.maxSteps)->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("--stop-at-target", o.stopAtTarget,
               "stop at the first evaluation at or above the target (not before --min-steps)");
  app.add_option("--min-steps", o.minSteps, "with --stop-at-target; also evaluated after it")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--lr", o.lr)->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum)->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed);
  app.add_option("--batch", o.batch, "samples per rank and step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--hidden", o.hidden, "features of the two hidden layers")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  CLI11_PARSE(app, argc, argv);
  try {
    train::keepFreedMemoryForReuse();
    torch::set_num_threads(1);
    auto world = init();
    return trainMlp(world, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compression_train: %s\n", e.what());
    return 1;
  }
}
