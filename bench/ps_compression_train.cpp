// Gradient compression with the parameter servers: one rank of a parameter-server job training
// the compression benchmark's model (bench/compression_train.cpp: Fashion-MNIST, MLP 784 -
// hidden - hidden - 10 with ReLUs, hidden 3072: 11.9 M parameters) in synchronous mode;
// bench/run_ps_compression.py runs it on an emulated slow network beside Shoal DDP.
//     build/shoal run -n 4 --servers 2 -- build/bench/ps_compression_train
//         --compression topk:0.01,warmup=2 --lr 0.03 --momentum 0.5   (one command line)
//
// Server ranks (shoal run --servers K) run ps::serve() until every worker said goodbye, then
// print one JSON line ("server": its index, what it served, the partition). Workers compute
// gradients on --batch samples per step from a DistributedSampler shard of the workers, push
// them through ps::Client with --compression (none, fp16, bf16, topk:D, onebit [,warmup=N]) and
// pull the parameters for the next step (as fp16 with --pull-half); the servers average the
// workers' gradients and apply SGD with --lr and --momentum (ps::TrainingConfig, constant rate),
// the same update as compression_train's DDP with libtorch's SGD.
//
// Evaluation, the clock and the stop rules are compression_train's: every --eval-every steps
// (and at --min-steps) training pauses and the workers classify the 10k test images with the
// parameters they pulled, each worker a contiguous quarter (in the workers' own group: the world
// includes the servers); rank 0's decision to stop travels in the same reduction. The clock and
// the byte counters run only while training.
//
// Worker 0 prints ONE JSON line:
//   impl "shoal-ps", spec (the canonical text), pull_half, workers, servers, params, steps,
//   median_step_seconds    worker 0's wall time per step (backward's end to the pulled values
//                          in the module, forward and backward included), median over the
//                          steps after the warm-up (the first step never counts)
//   bytes_per_step         worker 0's payload bytes pushed + pulled (ps::Client::traffic(),
//                          both servers, the one on its own host included; headers not
//                          counted) / steps, warm-up steps included
//   pushed_bytes_per_step, pulled_bytes_per_step   the two parts
//   bytes_per_step_compressed (and pushed_/pulled_ ... _compressed)   over the steps after the
//                          warm-up only
//   link_bytes_per_step    bytes the network interfaces of worker 0's host sent (/proc/net/dev,
//                          loopback excluded: what crosses its link, its server's replies and
//                          every rank of the host included, TCP/IP headers included) / steps;
//                          read at each pause after a barrier of the workers, so the replies
//                          still on their way to the other host's workers count for the step
//   train_seconds, seconds_to_target, steps_to_target, final_accuracy, final_loss, train_loss,
//   evals: as compression_train's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/fashion_mlp.h"
#include "comm/collectives.h"
#include "comm/compress/spec.h"
#include "common/error.h"
#include "ps/client.h"
#include "ps/config.h"
#include "ps/server.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/distributed_sampler.h"
#include "train/idx_dataset.h"
#include "train/ps_trainer.h"

using namespace shoal;
using bench::Clock;
using bench::linkBytesSent;
using bench::makeMlp;
using bench::median;
using bench::seconds;

namespace {

struct Options {
  std::string compression = "none";
  bool pullHalf = false;
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
  uint64_t pushed = 0, pulled = 0, linkBytes = 0;
  Clock::time_point start;
  ps::Traffic atStart;
  uint64_t linkAtStart = 0;
  uint64_t linkRead = 0;  // the interfaces' counter when current() was called

  void resume(const train::PsTrainer& ps) {
    start = Clock::now();
    atStart = ps.traffic();
    linkAtStart = linkBytesSent();
  }
  // The totals as if paused now (without pausing).
  Meter current(const train::PsTrainer& ps) const {
    Meter m = *this;
    const ps::Traffic t = ps.traffic();
    m.trainSeconds += seconds(start);
    m.pushed += t.pushedBytes - atStart.pushedBytes;
    m.pulled += t.pulledBytes - atStart.pulledBytes;
    m.linkRead = linkBytesSent();
    m.linkBytes += m.linkRead - linkAtStart;
    return m;
  }
  // Once every worker finished the step (after a barrier of the workers): what the link sent
  // since current(). Worker 0 can have its pull while its host's server still answers the other
  // host's workers; those bytes belong to the step.
  void settleLink() {
    const uint64_t now = linkBytesSent();
    linkBytes += now - linkRead;
    linkRead = now;
  }
};

int serveMain(const World& world) {
  ps::ServerOptions so;
  so.quiet = true;
  const int workers = world.size - world.numServers;
  const auto r = ps::serve(*world.group, world.roleRank, world.numServers, workers, so);
  const nlohmann::json row{{"server", world.roleRank},
                           {"pushes", r.pushes},
                           {"pulls", r.pulls},
                           {"refused", r.refused},
                           {"applied_on_arrival", r.appliedOnArrival},
                           {"streamed", r.streamed},
                           {"final_step", r.finalStep},
                           {"partition", r.partition}};
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
  return 0;
}

int trainMlp(const World& world, const Options& o) {
  if (world.numServers == 0) {
    SHOAL_THROW(InvalidArgument, "no parameter servers: start the job with shoal run --servers K");
  }
  if (world.role == run::Role::kServer) return serveMain(world);
  const auto spec = compress::CompressionSpec::parse(o.compression);
  const int numWorkers = world.size - world.numServers;
  // The workers' own group (evaluation, the stop vote): the world includes the servers.
  std::shared_ptr<comm::Group> workers =
      world.group->connect("workers", world.roleRank, numWorkers);
  comm::Group& g = *workers;
  const int rank = g.rank();

  torch::manual_seed(o.seed);  // the same initial model on every worker (worker 0's is uploaded)
  auto trainSet = train::readIdxDataset(train::kFashionMnistDir, "train");
  auto testSet = train::readIdxDataset(train::kFashionMnistDir, "t10k");
  auto net = makeMlp(o.hidden);
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();

  ps::TrainingConfig pc;
  pc.mode = ps::Mode::kSync;
  pc.optimizer = {OptimizerKind::kSgd, o.lr, o.momentum};
  ps::ClientOptions client;
  client.compression = spec;
  client.pullHalf = o.pullHalf;
  train::PsTrainer ps(*world.group, world.roleRank, numWorkers, world.numServers, *net, pc, client);
  SHOAL_CHECK(ps.startStep() == 0, "the servers resumed at step {}: expected a fresh job",
              ps.startStep());

  train::DistributedSampler sampler(trainSet.size(), rank, g.size(), {.seed = o.seed});
  const int64_t perEpoch = sampler.batches(o.batch);

  // This worker's contiguous share of the test set.
  const int64_t n = testSet.size();
  const int64_t lo = n * rank / g.size(), hi = n * (rank + 1) / g.size();

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
  comm::barrier(g);
  meter.resume(ps);
  for (bool stop = false; !stop;) {
    const int64_t b = step % perEpoch;
    if (b == 0) {
      order = sampler.indices(++epoch);
      idxAll = torch::from_blob(order.data(), {static_cast<int64_t>(order.size())}, torch::kInt64);
    }
    auto idx = idxAll.slice(0, b * o.batch, std::min<int64_t>((b + 1) * o.batch, order.size()));
    const auto t0 = Clock::now();
    net->zero_grad();
    auto x = trainSet.images.index_select(0, idx).view({-1, 784});
    auto loss =
        torch::nn::functional::cross_entropy(net->forward(x), trainSet.labels.index_select(0, idx));
    loss.backward();
    ps.step(step);  // push step `step`, pull the values for the next one
    stepSeconds.push_back(seconds(t0));
    lossWindow.push_back(loss.item<double>());
    ++step;
    if (step == spec.warmupSteps) atWarmup = meter.current(ps);
    if (step % o.evalEvery != 0 && step < o.maxSteps && step != o.minSteps) continue;

    meter = meter.current(ps);
    comm::barrier(g);
    meter.settleLink();
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
    if (rank == 0) sums[2] = step >= o.maxSteps || meter.trainSeconds >= o.maxSeconds;
    comm::allreduce(g, sums, 3, DataType::kFloat64, ReduceOp::kSum);
    net->train();
    accuracy = sums[0] / static_cast<double>(n);
    testLoss = sums[1] / static_cast<double>(n);
    evals.push_back({static_cast<double>(step), meter.trainSeconds, accuracy});
    if (!toTarget && accuracy >= o.targetAccuracy) {
      toTarget = meter.trainSeconds;
      stepsToTarget = step;
    }
    // Every worker has the same sums, so decides the same.
    stop = sums[2] > 0 || (o.stopAtTarget && toTarget && step >= o.minSteps);
    if (!stop) {
      lossWindow.clear();
      comm::barrier(g);
      meter.resume(ps);
    }
  }
  ps.finish();

  if (rank == 0) {
    const size_t skip = std::max<int64_t>(spec.warmupSteps, 1);
    std::vector<double> steady(stepSeconds.begin() + std::min(skip, stepSeconds.size() - 1),
                               stepSeconds.end());
    double trainLoss = 0;
    for (double l : lossWindow) trainLoss += l / static_cast<double>(lossWindow.size());
    const double steps = static_cast<double>(step);
    const auto perStep = [](uint64_t bytes, double count) {
      return static_cast<double>(bytes) / count;
    };
    nlohmann::json row{{"impl", "shoal-ps"},
                       {"spec", spec.toString()},
                       {"pull_half", o.pullHalf},
                       {"workers", numWorkers},
                       {"servers", world.numServers},
                       {"params", params},
                       {"batch", o.batch},
                       {"lr", o.lr},
                       {"momentum", o.momentum},
                       {"steps", step},
                       {"median_step_seconds", median(steady)},
                       {"bytes_per_step", perStep(meter.pushed + meter.pulled, steps)},
                       {"pushed_bytes_per_step", perStep(meter.pushed, steps)},
                       {"pulled_bytes_per_step", perStep(meter.pulled, steps)},
                       {"link_bytes_per_step", perStep(meter.linkBytes, steps)},
                       {"train_seconds", meter.trainSeconds},
                       {"target_accuracy", o.targetAccuracy},
                       {"seconds_to_target", toTarget ? nlohmann::json(*toTarget) : nullptr},
                       {"steps_to_target", toTarget ? nlohmann::json(stepsToTarget) : nullptr},
                       {"final_accuracy", accuracy},
                       {"final_loss", testLoss},
                       {"train_loss", trainLoss},
                       {"evals", evals}};
    if (atWarmup && step > spec.warmupSteps) {
      const double after = static_cast<double>(step - spec.warmupSteps);
      const uint64_t pushed = meter.pushed - atWarmup->pushed,
                     pulled = meter.pulled - atWarmup->pulled;
      row["bytes_per_step_compressed"] = perStep(pushed + pulled, after);
      row["pushed_bytes_per_step_compressed"] = perStep(pushed, after);
      row["pulled_bytes_per_step_compressed"] = perStep(pulled, after);
    } else if (!spec.enabled() || spec.warmupSteps == 0) {
      row["bytes_per_step_compressed"] = row["bytes_per_step"];
      row["pushed_bytes_per_step_compressed"] = row["pushed_bytes_per_step"];
      row["pulled_bytes_per_step_compressed"] = row["pulled_bytes_per_step"];
    }
    std::printf("%s\n", row.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "the parameter-server compression benchmark's training loop (a rank of `shoal run "
      "--servers K`)"};
  Options o;
  app.add_option("--compression", o.compression,
                 "pushes: none | fp16 | bf16 | topk:D | onebit [,warmup=N]");
  app.add_flag("--pull-half", o.pullHalf, "pull the parameters as fp16");
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
  app.add_option("--lr", o.lr, "the servers' SGD rate (constant)")->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "the servers' SGD momentum")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed);
  app.add_option("--batch", o.batch, "samples per worker and step")
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
    std::fprintf(stderr, "ps_compression_train: %s\n", e.what());
    return 1;
  }
}
