// The elastic-recovery benchmark's Shoal program (bench/run_elastic.py runs it beside torchrun's
// restart-all, bench/torchrun_elastic.py). One worker of `shoal run --elastic 2:4 -n 4`:
// Fashion-MNIST, MLP 784-256-256-10 with ReLUs, SGD lr 0.05 momentum 0.9, --batch samples per
// rank and step dealt by train/elastic_sampler.h, train::ElasticState committing after every
// step (an in-memory snapshot). --zero 2: ZeRO stage 2 (the same SGD) through
// train::zero::ElasticZero instead of DDP: each rank keeps a shard, and a copy of the previous
// rank's. --compression SPEC (DDP): the gradients go through ddp::compressionHook(SPEC), whose
// state ElasticState keeps at each commit (ElasticOptions::commHook), or with --hook-state drop
// does not (what the state's keeping costs a step).
//
// --kill-member M --kill-step S: member M prints {"event":"kill","time":T,"step":S} (T: the
// wall clock, seconds) and SIGKILLs itself right after its forward of step S, so its peers
// fail inside that step's all-reduce. The survivors go on; rank 0 of the last view prints one
// JSON line at the end:
//   impl "shoal" ("shoal-zero2" with --zero 2), steps, world (the last view's size), resumed_step
//   (the step the survivors continued from; -1 without a view change), first_step_after (the wall
//   clock when the first step after the view change completed on this rank; null without one),
//   recovery_seconds (ElasticState's own measure: the failure caught to the new group formed),
//   final_accuracy (the 10k test images, shared among the ranks), train_seconds (from the first
//   step to the last, evaluation excluded), commit_seconds (this rank's time in
//   ElasticState::commit over all steps: the in-memory snapshots).
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/elastic.h"
#include "train/elastic_sampler.h"
#include "train/idx_dataset.h"
#include "train/zero/zero_elastic.h"

namespace {

using namespace shoal;

double wallClock() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Options {
  int64_t steps = 240, batch = 64;
  int killMember = -1;
  int64_t killStep = 0;
  uint64_t seed = 1;
  int zeroStage = 0;  // 0: DDP
  std::string compression;
  bool keepHookState = true;
};

int runWorker(const Options& o) {
  torch::set_num_threads(1);
  auto world = init();
  SHOAL_CHECK(world.elastic.has_value(), "run me under shoal run --elastic");
  const int member = world.elastic->membership->id();
  auto trainSet = train::readIdxDataset(train::kFashionMnistDir, "train");
  auto testSet = train::readIdxDataset(train::kFashionMnistDir, "t10k");
  torch::manual_seed(static_cast<int64_t>(o.seed));
  auto net = torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                                   torch::nn::Linear(256, 256), torch::nn::ReLU(),
                                   torch::nn::Linear(256, 10));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const train::ElasticSampler sampler(trainSet.size(), {.seed = o.seed});
  std::optional<train::zero::ElasticZero> zero;
  std::optional<train::ElasticState> elastic;
  train::DdpOptions ddpOptions;
  if (!o.compression.empty()) {
    SHOAL_CHECK(o.zeroStage == 0, "--compression: DDP only here");
    ddpOptions.commHook =
        train::ddp::compressionHook(compress::CompressionSpec::parse(o.compression));
  }
  if (o.zeroStage > 0) {
    train::zero::ZeroOptions z;
    z.stage = o.zeroStage;
    z.optimizer = {OptimizerKind::kSgd, 0.05, 0.9};
    zero.emplace(net.ptr(), z);
    elastic.emplace(*world.elastic, world.group, *zero);
  } else {
    train::ElasticOptions eo;
    if (o.keepHookState) eo.commHook = ddpOptions.commHook;
    elastic.emplace(*world.elastic, world.group, *net, opt, eo);
  }
  train::ElasticState& state = *elastic;
  bool changed = false;
  std::optional<double> firstStepAfter;
  state.onViewChange = [&](const comm::View&, const comm::View&) { changed = true; };

  double commitSeconds = 0;
  const double start = wallClock();
  state.run([&](comm::Group& group) {
    std::optional<train::DistributedDataParallel> ddp;
    if (!zero) ddp.emplace(net.ptr(), group.shared_from_this(), ddpOptions);
    for (auto p = state.progress(); p.step < o.steps;) {
      const auto s = sampler.step(p.epoch, p.position, group.rank(), group.size(), o.batch);
      auto idx = torch::tensor(s.indices, torch::kInt64);
      if (zero) {
        zero->zero().beforeForward();
      } else {
        opt.zero_grad();
        ddp->beforeForward();
      }
      auto out = net->forward(trainSet.images.index_select(0, idx).view({-1, 784}));
      auto loss = torch::nn::functional::cross_entropy(
                      out, trainSet.labels.index_select(0, idx),
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
                  (static_cast<double>(group.size()) / static_cast<double>(s.total));
      if (member == o.killMember && p.step + 1 == o.killStep) {
        std::printf("{\"event\":\"kill\",\"time\":%.6f,\"step\":%lld}\n", wallClock(),
                    static_cast<long long>(o.killStep));
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      if (zero) {
        zero->zero().backward(loss);
        zero->zero().step();
      } else {
        ddp->backward(loss);
        opt.step();
      }
      p = p.after(s.nextPosition, sampler.size());
      const double c0 = wallClock();
      state.commit(p);
      commitSeconds += wallClock() - c0;
      if (changed && !firstStepAfter) firstStepAfter = wallClock();
    }
  });
  const double trainSeconds = wallClock() - start;

  // Accuracy: each rank a contiguous share of the test set, the counts summed.
  torch::NoGradGuard noGrad;
  auto& group = *state.group();
  const int64_t n = testSet.size();
  const int64_t lo = n * group.rank() / group.size(), hi = n * (group.rank() + 1) / group.size();
  double correct = net->forward(testSet.images.slice(0, lo, hi).view({-1, 784}))
                       .argmax(1)
                       .eq(testSet.labels.slice(0, lo, hi))
                       .sum()
                       .item<double>();
  comm::allreduce(group, &correct, 1, DataType::kFloat64, ReduceOp::kSum);
  if (group.rank() == 0) {
    const auto& st = state.stats();
    std::printf(
        "{\"impl\":\"%s\",\"steps\":%lld,\"world\":%d,\"resumed_step\":%lld,"
        "\"first_step_after\":%s,\"recovery_seconds\":%.6f,\"final_accuracy\":%.6f,"
        "\"train_seconds\":%.3f,\"commit_seconds\":%.4f}\n",
        o.zeroStage > 0 ? fmt::format("shoal-zero{}", o.zeroStage).c_str() : "shoal",
        static_cast<long long>(state.progress().step), group.size(),
        static_cast<long long>(st.viewChanges ? st.lastResumedStep : -1),
        firstStepAfter ? fmt::format("{:.6f}", *firstStepAfter).c_str() : "null",
        st.lastRecoverySeconds, correct / static_cast<double>(n), trainSeconds, commitSeconds);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the elastic benchmark's training loop (a worker of shoal run --elastic)"};
  Options o;
  app.add_option("--steps", o.steps)->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--batch", o.batch)->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--kill-member", o.killMember);
  app.add_option("--kill-step", o.killStep);
  app.add_option("--seed", o.seed);
  app.add_option("--zero", o.zeroStage)->check(CLI::Range(0, 2));
  app.add_option("--compression", o.compression);
  std::string hookState = "keep";
  app.add_option("--hook-state", hookState)->check(CLI::IsMember({"keep", "drop"}));
  CLI11_PARSE(app, argc, argv);
  o.keepHookState = hookState == "keep";
  try {
    return runWorker(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_train: %s\n", e.what());
    return 1;
  }
}
