// One worker of the elastic Trainer tests (tests/elastic_trainer_test.cpp), run under
// `shoal run --elastic MIN:MAX`: train::Trainer (--strategy, ddp by default) on a small MLP
// (16-32-4) and a
// synthetic classification set (--samples points from a fixed seed, labelled by a fixed random
// linear map), with TrainerContext::elastic from the launcher.
//
//   --epochs E --steps-per-epoch K --batch B --accumulate A --optimizer sgd|adam --lr X
//   --linear-scaling --schedule-workers N --warmup N --cosine --compression SPEC --validate-every N
//   --checkpoint-dir D --checkpoint-every N --keep N --resume    (TrainerOptions' namesakes)
//   --die MEMBER:STEP   member MEMBER SIGKILLs itself in onStep of step STEP (after its
//                       all-reduce and optimizer step, before the step's commit)
//   --until-world W --min-view-steps V   train until a view after the launch's has W workers
//                       and has run V steps; then every rank leaves fit() at the same step by
//                       an exception (a test's stop, instead of a number of epochs)
//   --strategy NAME     the Trainer's (to see the refusal of the strategies that are not elastic)
//   --batchnorm         a BatchNorm1d after the first layer (buffers, an int64 one among them)
//
// Lines printed:
//   START member M step S epoch E                                 (each rank, in onFitStart)
//   VIEW member M generation G old O new N rank R resumed P      (each rank, at a view change)
//   EPOCH epoch E samples S loss L accuracy A                     (the view's rank 0)
//   DONE member M rank R world W step S changes C digest D sum X dot Y lr Z
// (D: FNV-1a of every parameter's bytes; X, Y: their sum and their dot product with a fixed
// pseudo-random vector, for comparisons within rounding; Z: the last step's rate). Errors: "ERROR
// <Type>: <message>", exit 1.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "tests/tensor_digest.h"
#include "train/trainer.h"

using namespace shoal;

namespace {

struct Options {
  int64_t samples = 600;
  int64_t batch = 8;
  int64_t accumulate = 1;
  int64_t epochs = 2;
  int64_t stepsPerEpoch = 0;
  std::string optimizer = "sgd";
  double lr = 0.05;
  bool linearScaling = false;
  int scheduleWorkers = 0;
  int64_t warmup = 0;
  bool cosine = false;
  std::string compression = "none";
  int64_t validateEvery = 0;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keep = 2;
  bool resume = false;
  std::string die;
  int untilWorld = 0;
  int64_t minViewSteps = 0;
  std::string strategy = "ddp";
  bool batchNorm = false;
};

// Thrown by every rank at the same step to leave fit() early.
struct Stop {};

class Report final : public train::Callback {
 public:
  Report(const Options& o, train::Trainer& trainer, const comm::Membership& membership)
      : o_(o), trainer_(trainer), membership_(membership), member_(membership.id()) {
    if (!o.die.empty()) {
      SHOAL_CHECK(std::sscanf(o.die.c_str(), "%d:%lld", &dieMember_, &dieStep_) == 2,
                  "--die MEMBER:STEP, not {}", o.die);
    }
  }

  void onFitStart(const train::Progress& at) override {
    std::printf("START member %d step %lld epoch %lld\n", member_, static_cast<long long>(at.step),
                static_cast<long long>(at.epoch));
    std::fflush(stdout);
  }

  void onViewChange(const train::ViewChange& v) override {
    std::printf("VIEW member %d generation %lld old %d new %d rank %d resumed %lld\n", member_,
                static_cast<long long>(v.generation), v.oldSize, v.newSize, v.rank,
                static_cast<long long>(v.resumedStep));
    std::fflush(stdout);
    stepsInView_ = 0;
    ++changes_;
  }

  void onStep(const train::StepInfo& s) override {
    if (member_ == dieMember_ && s.step == dieStep_) {
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    ++stepsInView_;
    lastLr_ = s.lr;
    if (o_.untilWorld > 0 && membership_.current().generation > 0 &&
        trainer_.workers().size() >= o_.untilWorld && stepsInView_ >= o_.minViewSteps) {
      throw Stop{};
    }
  }

  void onEpoch(const train::EpochMetrics& m) override {
    if (trainer_.workers().rank() != 0) return;
    std::printf("EPOCH epoch %lld samples %lld loss %.6f accuracy %.4f\n",
                static_cast<long long>(m.epoch), static_cast<long long>(m.samples), m.trainLoss,
                m.validationAccuracy);
    std::fflush(stdout);
  }

  int changes() const { return changes_; }
  double lastLr() const { return lastLr_; }

 private:
  const Options& o_;
  train::Trainer& trainer_;
  const comm::Membership& membership_;
  int member_;
  int dieMember_ = -1;
  long long dieStep_ = -1;
  int64_t stepsInView_ = 0;
  int changes_ = 0;
  double lastLr_ = 0;
};

int runWorker(const Options& o) {
  World world = init();
  SHOAL_CHECK(world.elastic.has_value(), "run it under shoal run --elastic");
  const int member = world.elastic->membership->id();

  torch::manual_seed(5);
  train::TensorDataset data;
  data.inputs = torch::randn({o.samples, 16});
  data.targets = data.inputs.matmul(torch::randn({16, 4})).argmax(1);

  train::TrainerOptions t;
  t.strategy = train::parseStrategy(o.strategy);
  t.optimizer.kind = train::parseOptimizer(o.optimizer);
  t.optimizer.lr = o.lr;
  t.epochs = o.untilWorld > 0 ? 1000000 : o.epochs;
  t.stepsPerEpoch = o.stepsPerEpoch;
  t.batch = o.batch;
  t.accumulate = o.accumulate;
  t.seed = 3;
  t.linearScaling = o.linearScaling;
  t.scheduleWorkers = o.scheduleWorkers;
  t.warmupSteps = o.warmup;
  t.cosineDecay = o.cosine;
  t.compression = compress::CompressionSpec::parse(o.compression);
  t.validateEvery = o.validateEvery;
  t.checkpointDir = o.checkpointDir;
  t.checkpointEvery = o.checkpointEvery;
  t.keep = o.keep;
  t.resume = o.resume;
  t.stragglerWindow = 4;  // made again for every view

  torch::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Linear(16, 32));
  if (o.batchNorm) model->push_back(torch::nn::BatchNorm1d(32));  // float and int64 buffers
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::Linear(32, 4));
  train::TrainerContext ctx{.world = world.group, .elastic = world.elastic};
  // The ModelBuilder constructor: its grid is made without communicating, as a joiner's must be.
  train::Trainer trainer(
      ctx, [&](const train::ProcessGrid&) { return model; }, train::crossEntropy, t);
  auto report = std::make_shared<Report>(o, trainer, *world.elastic->membership);
  trainer.addCallback(report);
  try {
    trainer.fit(data, &data);
  } catch (const Stop&) {
  }
  std::vector<torch::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach());
  const auto flat = torch::cat([&] {
    std::vector<torch::Tensor> v;
    for (const auto& p : params) v.push_back(p.reshape(-1).to(torch::kFloat64));
    return v;
  }());
  const auto probe = torch::sin(torch::arange(flat.numel(), torch::kFloat64) * 0.7);
  std::printf(
      "DONE member %d rank %d world %d step %lld changes %d digest %s sum %.12g dot %.12g lr "
      "%.9g\n",
      member, trainer.workers().rank(), trainer.workers().size(),
      static_cast<long long>(trainer.progress().step), report->changes(),
      test::tensorDigest(params).c_str(), flat.sum().item<double>(), flat.dot(probe).item<double>(),
      report->lastLr());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"elastic Trainer test worker"};
  Options o;
  app.add_option("--samples", o.samples);
  app.add_option("--batch", o.batch);
  app.add_option("--accumulate", o.accumulate);
  app.add_option("--epochs", o.epochs);
  app.add_option("--steps-per-epoch", o.stepsPerEpoch);
  app.add_option("--optimizer", o.optimizer);
  app.add_option("--lr", o.lr);
  app.add_flag("--linear-scaling", o.linearScaling);
  app.add_option("--schedule-workers", o.scheduleWorkers);
  app.add_option("--warmup", o.warmup);
  app.add_flag("--cosine", o.cosine);
  app.add_option("--compression", o.compression);
  app.add_option("--validate-every", o.validateEvery);
  app.add_option("--checkpoint-dir", o.checkpointDir);
  app.add_option("--checkpoint-every", o.checkpointEvery);
  app.add_option("--keep", o.keep);
  app.add_flag("--resume", o.resume);
  app.add_option("--die", o.die);
  app.add_option("--until-world", o.untilWorld);
  app.add_option("--min-view-steps", o.minViewSteps);
  app.add_option("--strategy", o.strategy);
  app.add_flag("--batchnorm", o.batchNorm);
  CLI11_PARSE(app, argc, argv);
  try {
    return runWorker(o);
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", shoal::test::typeName(e), e.what());
    std::fflush(stdout);
    return 1;
  }
}
