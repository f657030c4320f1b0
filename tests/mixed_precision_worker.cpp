// One rank of the mixed-precision process tests, run under `shoal run -n N`
// (tests/mixed_precision_process_test.cpp). Trains a small residual MLP (train/residual_mlp.h,
// LayerNorms included) on random 28x28 batches in --precision fp32 | bf16 | fp16, with loss
// scaling for fp16 (train/mixed_precision.h):
//
//   ddp       DistributedDataParallel over the world; the skip is agreed over the world group
//   pipeline  --stages stages per replica (world / stages replicas, 1F1B, 2 micro-batches); the
//             skip is agreed over the pipeline group, then the data group
//
// --inject-rank r --inject-step s: world rank r sets one element of its first parameter's
// gradient to inf after backward (after DDP's average, so only that rank sees it), before the
// scaler looks. Prints per step "rank R step S stepped 0|1 scale X loss L" (L unscaled), and at
// the end "DONE rank R skipped K scale X checksum C" (C: the sum of this rank's parameters, to
// compare replicas). Exit code 0 unless something threw ("ERROR <Type>: ...").
#include <fmt/format.h>

#include <iostream>
#include <limits>
#include <optional>
#include <string>

#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "train/ddp.h"
#include "train/mixed_precision.h"
#include "train/pipeline/pipeline.h"
#include "train/residual_mlp.h"

namespace pp = shoal::train::pipeline;
using shoal::train::AutocastGuard;
using shoal::train::Fp16Weights;
using shoal::train::LossScaler;
using shoal::train::Precision;

namespace {

struct Args {
  std::string mode = "ddp";
  Precision precision = Precision::kFloat16;
  int steps = 6;
  int stages = 2;
  int injectRank = -1;
  int injectStep = -1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "{} needs a value", k);
      return argv[++i];
    };
    if (k == "--mode")
      a.mode = next();
    else if (k == "--precision")
      a.precision = shoal::train::parsePrecision(next());
    else if (k == "--steps")
      a.steps = std::stoi(next());
    else if (k == "--stages")
      a.stages = std::stoi(next());
    else if (k == "--inject-rank")
      a.injectRank = std::stoi(next());
    else if (k == "--inject-step")
      a.injectStep = std::stoi(next());
    else
      SHOAL_THROW(InvalidArgument, "unknown argument {}", k);
  }
  return a;
}

constexpr int64_t kBatch = 32;  // global

torch::nn::Sequential makeModel() {
  torch::manual_seed(11);
  return shoal::train::residualMlp(/*blocks=*/2, /*hidden=*/32);
}

// Step k's global batch (the same on every rank): labels from a fixed random linear teacher, so
// there is something to learn.
std::pair<torch::Tensor, torch::Tensor> batch(int k) {
  auto gen = at::detail::createCPUGenerator(500 + k);
  auto teacher = at::detail::createCPUGenerator(99);
  torch::Tensor x = torch::randn({kBatch, 1, 28, 28}, gen);
  torch::Tensor w = torch::randn({28 * 28, 10}, teacher);
  return {x, x.flatten(1).mm(w).argmax(1)};
}

torch::Tensor part(const torch::Tensor& t, int index, int parts) {
  const int64_t n = t.size(0) / parts;
  return t.narrow(0, index * n, n);
}

void inject(const Args& a, int rank, int step, const std::vector<torch::Tensor>& params) {
  if (rank == a.injectRank && step == a.injectStep) {
    params.at(0).grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  }
}

void report(int rank, int step, bool stepped, double scale, double loss) {
  std::cout << fmt::format("rank {} step {} stepped {} scale {} loss {:.6f}\n", rank, step,
                           stepped ? 1 : 0, scale, loss)
            << std::flush;
}

void done(int rank, const LossScaler& scaler, const std::vector<torch::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params) sum += p.to(torch::kFloat64).sum().item<double>();
  std::cout << fmt::format("DONE rank {} skipped {} scale {} checksum {:.17g}\n", rank,
                           scaler.skippedSteps(), scaler.currentScale(), sum)
            << std::flush;
}

int ddp(const Args& a, const shoal::World& world) {
  auto net = makeModel();
  shoal::train::DistributedDataParallel ddp(net.ptr(), world.group);
  auto params = net->parameters();
  torch::optim::Adam opt(params, torch::optim::AdamOptions(3e-3));
  LossScaler scaler(a.precision);
  Fp16Weights fp16(params);
  for (int k = 0; k < a.steps; ++k) {
    auto [x, y] = batch(k);
    opt.zero_grad();
    torch::Tensor loss;
    {
      std::optional<Fp16Weights::Scope> scope;
      if (a.precision == Precision::kFloat16) scope.emplace(fp16.scope());
      {
        AutocastGuard autocast(a.precision);
        loss = torch::nn::functional::cross_entropy(net->forward(part(x, world.rank, world.size)),
                                                    part(y, world.rank, world.size));
      }
      ddp.backward(scaler.scale(loss));
    }
    inject(a, world.rank, k, params);
    const double scale = scaler.currentScale();
    const bool stepped = scaler.step(opt, params, {world.group});
    report(world.rank, k, stepped, scale, loss.item<double>());
  }
  done(world.rank, scaler, params);
  return 0;
}

int pipeline(const Args& a, const shoal::World& world) {
  pp::Grid grid = pp::makeGrid(world.group, a.stages);
  LossScaler scaler(a.precision);
  auto lossFn = [&](const torch::Tensor& out, const torch::Tensor& y) {
    return scaler.scale(torch::nn::functional::cross_entropy(out, y));
  };
  pp::PipelineOptions o;
  o.microBatches = 2;
  o.printPlan = false;
  o.split = pp::SplitMethod::kParameters;
  auto net = makeModel();
  auto [x0, y0] = batch(0);
  // Note [Where autocast goes]: the plan records what crosses stages in bf16.
  std::optional<pp::Pipeline> pipe;
  {
    AutocastGuard autocast(a.precision);
    pipe.emplace(net, grid, x0.narrow(0, 0, 2), lossFn, o);
  }
  auto params = pipe->parameters();
  torch::optim::Adam opt(params, torch::optim::AdamOptions(3e-3));
  Fp16Weights fp16(params);
  for (int k = 0; k < a.steps; ++k) {
    auto [x, y] = batch(k);
    opt.zero_grad();
    const double scale = scaler.currentScale();
    torch::Tensor loss;
    {
      std::optional<Fp16Weights::Scope> scope;
      if (a.precision == Precision::kFloat16) scope.emplace(fp16.scope());
      AutocastGuard autocast(a.precision);
      loss = pipe->step(part(x, grid.replica, grid.replicas), part(y, grid.replica, grid.replicas));
    }
    inject(a, world.rank, k, params);
    const bool stepped = scaler.step(opt, params, {grid.pipe, grid.data});
    report(world.rank, k, stepped, scale, loss.item<double>() / scale);
  }
  done(world.rank, scaler, params);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    Args a = parse(argc, argv);
    shoal::World world = shoal::init();
    if (a.mode == "ddp") return ddp(a, world);
    if (a.mode == "pipeline") return pipeline(a, world);
    SHOAL_THROW(InvalidArgument, "unknown mode {}", a.mode);
  } catch (const shoal::Error& e) {
    std::cerr << "ERROR " << shoal::test::typeName(e) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR " << e.what() << "\n";
    return 1;
  }
}
