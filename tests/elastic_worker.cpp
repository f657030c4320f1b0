// One worker of the elastic tests (tests/elastic_test.cpp), run under `shoal run`.
//
// It trains a small MLP (16-32-4) on a synthetic classification set (--samples points drawn
// from a fixed seed, labelled by a fixed random linear map) with DistributedDataParallel and
// SGD with momentum, the data dealt by train/elastic_sampler.h (--batch per rank, a summed loss
// scaled by world / total, so any spread of a step's samples averages exactly).
//
//   elastic  (under shoal run --elastic): train::ElasticState runs the loop for --steps steps
//            (and on until the view has --until-world workers again, or at most --until-shrunk-to
//            workers, if given; and each view for at least --min-view-steps steps), committing
//            after each step. --die MEMBER:STEP:before|middle|after makes member MEMBER SIGKILL
//            itself in step STEP: after its forward (its peers fail inside that step's
//            all-reduce), after its backward (its all-reduce done; with --fp16 its peers fail in
//            the loss scaler's agreement on skipping) or after the optimizer step (its all-reduce,
//            or ZeRO's all-gather, done; before the commit). Repeatable. --progress-every N: rank 0
//            prints "STEP <n>" every N steps (tests wait for it before acting on the job).
//            --checkpoint PATH: where the state goes when the job gives up below the minimum;
//            --resume PATH starts from it. --started-file PATH: rank 0 creates PATH after a
//            step at a view of --started-at workers (default: any), the signal a test's host
//            discovery program waits for. --lr-scaling none|linear|sqrt: ElasticOptions'
//            (each worker prints "LR member M world W lr X" at the end).
//   plain    (--plain, under shoal run without --elastic): the same loop on the world group,
//            no elasticity: from --load PATH (or the start) until step --steps, then --save PATH
//            (rank 0). Two plain jobs chained through a file are the reference an elastic run
//            that shrank must equal bit for bit.
//   --zero STAGE: the same with ZeroDataParallel (stage 1 or 2, the same SGD) instead of DDP:
//            elastic through zero::ElasticZero; plain --load/--save take a sharded checkpoint
//            folder (written by every rank).
//   --compression SPEC (DDP, or --zero 1): the gradients go through
//            ddp::compressionHook(SPEC), kept by ElasticState or ElasticZero (one hook object
//            for every view), and every rank prints after each commit
//              HOOK member M step S own D shared E steps K
//            (D, E: FNV-1a of the hook's per-rank and of its shared tensors; K: its step count),
//            and the same line starting HOOKIN when a view after the first starts.
//   --fp16 (DDP): a LossScaler (fp16, starting at 1024, doubling every 3 good steps) scales the
//            loss and steps the optimizer, kept by ElasticOptions::lossScaler (and in the plain
//            mode's --save/--load); every rank prints at the end
//              SCALE member M scale X steps K
//
// Every rank prints at the end one line:
//   DONE member M rank R world W step S resumed P changes C recovery T digest D
// (D: FNV-1a of every parameter's bytes; P: the step the last view change continued from;
// T: that change's recovery seconds). Errors: "ERROR <Type>: <message>", exit 1.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "tests/tensor_digest.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/elastic.h"
#include "train/elastic_sampler.h"
#include "train/mixed_precision.h"
#include "train/zero/zero_elastic.h"

namespace {

using namespace shoal;
using train::ElasticProgress;

struct Death {
  enum Where { kBefore, kMiddle, kAfter };
  int member = -1;
  int64_t step = 0;
  Where where = kBefore;
};

struct Options {
  int64_t steps = 40, samples = 600, batch = 8;
  int untilWorld = 0, untilShrunkTo = 0;
  int64_t minViewSteps = 0;
  int64_t progressEvery = 0;
  std::vector<std::string> die;
  std::string checkpoint, resume, load, save, startedFile;
  int startedAt = 0;
  int zeroStage = 0;
  std::string lrScaling = "none";
  std::string compression;
  bool plain = false;
  bool fp16 = false;
};

struct Data {
  torch::Tensor x, y;
};

Data makeData(int64_t n) {
  torch::manual_seed(7);
  Data d;
  d.x = torch::randn({n, 16});
  auto w = torch::randn({16, 4});
  d.y = d.x.matmul(w).argmax(1);
  return d;
}

torch::nn::Sequential makeModel() {
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 4));
}

std::string digest(torch::nn::Module& m) {
  return test::tensorDigest(m.parameters());
}

// The digest of a hook state's per-rank (or shared) tensors, in (key, parameter) order.
std::string hookDigest(train::ddp::HookState state, bool perRank) {
  state.sortTensors();
  std::vector<torch::Tensor> tensors;
  for (const auto& t : state.tensors) {
    if (t.perRank == perRank) tensors.push_back(t.data);
  }
  return test::tensorDigest(tensors);
}

void printHook(const char* what, const train::ddp::CommHook& hook, int member, int64_t step) {
  const auto state = hook.exportState();
  SHOAL_CHECK(state.has_value(), "--compression: the hook keeps no state");
  std::printf("%s member %d step %lld own %s shared %s steps %lld\n", what, member,
              static_cast<long long>(step), hookDigest(*state, true).c_str(),
              hookDigest(*state, false).c_str(), static_cast<long long>(state->steps));
  std::fflush(stdout);
}

Death parseDeath(const std::string& text) {
  Death d;
  char where[16] = {};
  long long step = 0;
  const std::string w =
      std::sscanf(text.c_str(), "%d:%lld:%15s", &d.member, &step, where) == 3 ? where : "";
  if (w != "before" && w != "middle" && w != "after") {
    SHOAL_THROW(InvalidArgument, "--die {}: expected MEMBER:STEP:before|middle|after", text);
  }
  d.step = step;
  d.where = w == "before" ? Death::kBefore : w == "middle" ? Death::kMiddle : Death::kAfter;
  return d;
}

// How a step's gradients are averaged and applied: DDP and the optimizer, or ZeRO.
struct Engine {
  std::function<void()> beforeForward;
  std::function<void(const torch::Tensor&)> backward;
  std::function<void()> step;
};

// With a scaler: the loss scaled before backward, the optimizer stepped by the scaler (which
// agrees with the other ranks of `group` on skipping).
Engine ddpEngine(train::DistributedDataParallel& ddp, torch::optim::Optimizer& opt,
                 train::LossScaler* scaler, comm::Group& group) {
  return {[&] {
            opt.zero_grad();
            ddp.beforeForward();
          },
          [&ddp, scaler](const torch::Tensor& loss) {
            ddp.backward(scaler ? scaler->scale(loss) : loss);
          },
          [&opt, scaler, &group] {
            if (!scaler) {
              opt.step();
              return;
            }
            std::vector<torch::Tensor> params;
            for (const auto& pg : opt.param_groups()) {
              for (const auto& p : pg.params()) params.push_back(p);
            }
            scaler->step(opt, params, {group.shared_from_this()});
          }};
}

Engine zeroEngine(train::zero::ZeroDataParallel& zero) {
  return {[&] { zero.beforeForward(); }, [&](const torch::Tensor& loss) { zero.backward(loss); },
          [&] { zero.step(); }};
}

train::zero::ZeroOptions zeroOptions(int stage, std::shared_ptr<train::ddp::CommHook> hook) {
  train::zero::ZeroOptions o;
  o.stage = stage;
  o.optimizer = {OptimizerKind::kSgd, 0.05, 0.9};
  o.commHook = std::move(hook);
  return o;
}

train::DdpOptions ddpOptions(std::shared_ptr<train::ddp::CommHook> hook) {
  train::DdpOptions o;
  o.commHook = std::move(hook);
  return o;
}

// One step at `p` on `group`: this rank's share of the samples, the scaled summed loss, the
// engine's average and step. `member`'s planned deaths happen here.
ElasticProgress trainStep(comm::Group& group, const Engine& engine, torch::nn::Module& model,
                          const train::ElasticSampler& sampler, const Data& data, int64_t batch,
                          const ElasticProgress& p, int member, const std::vector<Death>& deaths) {
  const auto s = sampler.step(p.epoch, p.position, group.rank(), group.size(), batch);
  auto idx = torch::tensor(s.indices, torch::kInt64);
  engine.beforeForward();
  auto out = model.as<torch::nn::Sequential>()->forward(data.x.index_select(0, idx));
  auto loss = torch::nn::functional::cross_entropy(
                  out, data.y.index_select(0, idx),
                  torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
              (static_cast<double>(group.size()) / static_cast<double>(s.total));
  const auto dieIf = [&](Death::Where where) {
    for (const auto& d : deaths) {
      if (d.member == member && d.step == p.step + 1 && d.where == where) ::raise(SIGKILL);
    }
  };
  dieIf(Death::kBefore);
  engine.backward(loss);
  dieIf(Death::kMiddle);
  engine.step();
  dieIf(Death::kAfter);
  return p.after(s.nextPosition, sampler.size());
}

void saveState(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& opt,
               const train::LossScaler* scaler, const ElasticProgress& p) {
  torch::serialize::OutputArchive a, m, o;
  model.save(m);
  opt.save(o);
  a.write("model", m);
  a.write("optimizer", o);
  if (scaler) scaler->save(a);
  a.write("progress", torch::tensor({p.step, p.epoch, p.position}, torch::kInt64));
  a.save_to(path);
}

ElasticProgress loadState(const std::string& path, torch::nn::Module& model,
                          torch::optim::Optimizer& opt, train::LossScaler* scaler) {
  torch::serialize::InputArchive a, m, o;
  a.load_from(path);
  a.read("model", m);
  a.read("optimizer", o);
  model.load(m);
  opt.load(o);
  if (scaler) scaler->load(a);
  torch::Tensor t;
  a.read("progress", t);
  return {t[0].item<int64_t>(), t[1].item<int64_t>(), t[2].item<int64_t>()};
}

int runWorker(Options o) {
  torch::set_num_threads(1);
  std::vector<Death> deaths;
  for (const auto& d : o.die) deaths.push_back(parseDeath(d));
  auto world = init();
  const Data data = makeData(o.samples);
  const train::ElasticSampler sampler(o.samples, {.shuffle = true, .seed = 3});
  auto model = makeModel();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int member = world.elastic ? world.elastic->membership->id() : world.rank;
  std::optional<train::LossScaler> scalerHolder;
  if (o.fp16) {
    SHOAL_CHECK(o.zeroStage == 0, "--fp16: DDP only");
    scalerHolder.emplace(train::Precision::kFloat16,
                         train::LossScalerOptions{.initScale = 1024, .growthInterval = 3});
  }
  train::LossScaler* scaler = scalerHolder ? &*scalerHolder : nullptr;
  const auto printScale = [&] {
    if (!scaler) return;
    std::printf("SCALE member %d scale %.17g steps %lld\n", member, scaler->currentScale(),
                static_cast<long long>(scaler->steps()));
  };
  const std::shared_ptr<train::ddp::CommHook> hook =
      o.compression.empty()
          ? nullptr
          : train::ddp::compressionHook(compress::CompressionSpec::parse(o.compression));

  if (o.plain) {
    ElasticProgress p;
    std::optional<train::DistributedDataParallel> ddp;
    std::optional<train::zero::ZeroDataParallel> zero;
    Engine engine;
    if (o.zeroStage > 0) {
      zero.emplace(std::shared_ptr<torch::nn::Module>(model.ptr()), world.group,
                   zeroOptions(o.zeroStage, hook));
      if (!o.load.empty()) {
        const auto loaded = zero->load(o.load);
        SHOAL_CHECK(loaded.has_value(), "--load {}: no checkpoint", o.load);
        p = {loaded->step, loaded->epoch, loaded->batchInEpoch};
      }
      engine = zeroEngine(*zero);
    } else {
      if (!o.load.empty()) p = loadState(o.load, *model, opt, scaler);
      ddp.emplace(model.ptr(), world.group, ddpOptions(hook));
      engine = ddpEngine(*ddp, opt, scaler, *world.group);
    }
    while (p.step < o.steps) {
      p = trainStep(*world.group, engine, *model, sampler, data, o.batch, p, member, deaths);
    }
    if (!o.save.empty() && zero) zero->save(o.save, {p.epoch, p.position, p.step});
    if (!o.save.empty() && !zero && world.rank == 0) saveState(o.save, *model, opt, scaler, p);
    comm::barrier(*world.group);
    printScale();
    std::printf(
        "DONE member %d rank %d world %d step %lld resumed -1 changes 0 recovery 0 digest %s\n",
        member, world.rank, world.size, static_cast<long long>(p.step), digest(*model).c_str());
    return 0;
  }

  SHOAL_CHECK(world.elastic.has_value(), "elastic mode needs shoal run --elastic");
  const train::ElasticOptions elastic{
      .admitEvery = 1,
      .checkpointPath = o.checkpoint,
      .lrScaling = o.lrScaling == "linear" ? train::LrScaling::kLinear
                   : o.lrScaling == "sqrt" ? train::LrScaling::kSqrt
                                           : train::LrScaling::kNone};
  std::optional<train::zero::ElasticZero> keeper;
  std::optional<train::ElasticState> stateHolder;
  if (o.zeroStage > 0) {
    keeper.emplace(model.ptr(), zeroOptions(o.zeroStage, hook));
    stateHolder.emplace(*world.elastic, world.group, *keeper, elastic);
  } else {
    auto withState = elastic;
    withState.commHook = hook;
    withState.lossScaler = scaler;
    stateHolder.emplace(*world.elastic, world.group, *model, opt, withState);
  }
  train::ElasticState& state = *stateHolder;
  if (!o.resume.empty()) state.load(o.resume);
  state.run([&](comm::Group& group) {
    std::optional<train::DistributedDataParallel> ddp;
    Engine engine;
    if (keeper) {
      engine = zeroEngine(keeper->zero());
    } else {
      ddp.emplace(model.ptr(), group.shared_from_this(), ddpOptions(hook));
      engine = ddpEngine(*ddp, opt, scaler, group);
    }
    if (hook && state.progress().step > 0) {
      printHook("HOOKIN", *hook, member, state.progress().step);
    }
    int64_t inView = 0;
    for (auto p = state.progress();
         p.step < o.steps || group.size() < o.untilWorld ||
         (o.untilShrunkTo > 0 && group.size() > o.untilShrunkTo) || inView < o.minViewSteps;
         ++inView) {
      p = trainStep(group, engine, *model, sampler, data, o.batch, p, member, deaths);
      state.commit(p);
      if (hook) printHook("HOOK", *hook, member, p.step);
      if (!o.startedFile.empty() && group.rank() == 0 &&
          (o.startedAt == 0 || group.size() == o.startedAt)) {
        std::FILE* f = std::fopen(o.startedFile.c_str(), "w");
        SHOAL_CHECK(f != nullptr, "--started-file {}: cannot be created", o.startedFile);
        std::fclose(f);
        o.startedFile.clear();
      }
      if (o.progressEvery > 0 && p.step % o.progressEvery == 0 && group.rank() == 0) {
        std::printf("STEP %lld\n", static_cast<long long>(p.step));
        std::fflush(stdout);
      }
    }
  });
  printScale();
  const auto& s = state.stats();
  // (ZeRO's optimizer is its own: not printed.)
  if (!keeper) {
    std::printf("LR member %d world %d lr %.17g\n", member, state.group()->size(),
                opt.param_groups()[0].options().get_lr());
  }
  std::printf(
      "DONE member %d rank %d world %d step %lld resumed %lld changes %d recovery %.3f "
      "digest %s\n",
      member, state.group()->rank(), state.group()->size(),
      static_cast<long long>(state.progress().step),
      static_cast<long long>(s.viewChanges ? s.lastResumedStep : -1), s.viewChanges,
      s.lastRecoverySeconds, digest(*model).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"elastic test worker"};
  Options o;
  app.add_option("--steps", o.steps);
  app.add_option("--samples", o.samples);
  app.add_option("--batch", o.batch);
  app.add_option("--until-world", o.untilWorld);
  app.add_option("--until-shrunk-to", o.untilShrunkTo);
  app.add_option("--min-view-steps", o.minViewSteps);
  app.add_option("--started-file", o.startedFile);
  app.add_option("--started-at", o.startedAt);
  app.add_option("--lr-scaling", o.lrScaling)->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app.add_option("--progress-every", o.progressEvery);
  app.add_option("--die", o.die);
  app.add_option("--checkpoint", o.checkpoint);
  app.add_option("--resume", o.resume);
  app.add_option("--load", o.load);
  app.add_option("--save", o.save);
  app.add_flag("--plain", o.plain);
  app.add_option("--zero", o.zeroStage)->check(CLI::Range(1, 2));
  app.add_option("--compression", o.compression);
  app.add_flag("--fp16", o.fp16);
  CLI11_PARSE(app, argc, argv);
  try {
    return runWorker(o);
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", shoal::test::typeName(e), e.what());
    std::fflush(stdout);
    return 1;
  }
}
