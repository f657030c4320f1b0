// One rank of the pipeline tests, run under `shoal run -n N` (tests/pipeline_test.cpp).
//
//   equivalence  every schedule x micro-batch count x activation checkpointing on the grid
//                (world / --stages replicas): after --steps steps each rank's parameters must
//                equal those of one-process training of the same model on the same global
//                batch (rtol 1e-5); prints "OK <config>" or "FAIL <config>: ..." per config
//   bubble       equal-cost synthetic stages (layers that sleep): prints each rank's measured
//                idle fraction and the formula's, and the peak number of micro-batches in flight
//   bad-shape    stage 0's output doubles its width at step 1 (both ranks must fail, naming it)
//   train        a few steps with checkpoints: --checkpoint-dir, --checkpoint-every,
//                --crash-at-step (SIGKILL of --crash-rank before that step, in the first
//                attempt of a job shoal run restarts), --resume (if a checkpoint exists),
//                --save-params (this rank's parameters after the last step)
// Exit code 0 only if everything checked held.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "train/pipeline/pipeline.h"
#include "train/pipeline/stage_checkpoint.h"
#include "train/residual_mlp.h"

namespace pp = shoal::train::pipeline;

namespace {

struct Args {
  std::string mode = "equivalence";
  int stages = 2;
  int steps = 3;
  std::string schedules = "gpipe,1f1b,interleaved";
  std::string microBatches;  // default: 1, p, 2p+1
  std::string split = "parameters";
  double fwdMs = 20, bwdMs = 40;
  std::string checkpointDir;
  int checkpointEvery = 2;
  int crashAtStep = -1;
  int crashRank = -1;
  bool resume = false;
  std::string saveParams;
  std::string schedule = "1f1b";
  int m = 4;
  int chunks = 1;
  bool activationCheckpointing = false;
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "{} needs a value", k);
      return argv[++i];
    };
    if (k == "--mode")
      a.mode = next();
    else if (k == "--stages")
      a.stages = std::stoi(next());
    else if (k == "--steps")
      a.steps = std::stoi(next());
    else if (k == "--schedules")
      a.schedules = next();
    else if (k == "--micro-batch-counts")
      a.microBatches = next();
    else if (k == "--split")
      a.split = next();
    else if (k == "--fwd-ms")
      a.fwdMs = std::stod(next());
    else if (k == "--bwd-ms")
      a.bwdMs = std::stod(next());
    else if (k == "--checkpoint-dir")
      a.checkpointDir = next();
    else if (k == "--checkpoint-every")
      a.checkpointEvery = std::stoi(next());
    else if (k == "--crash-at-step")
      a.crashAtStep = std::stoi(next());
    else if (k == "--crash-rank")
      a.crashRank = std::stoi(next());
    else if (k == "--resume")
      a.resume = true;
    else if (k == "--save-params")
      a.saveParams = next();
    else if (k == "--schedule")
      a.schedule = next();
    else if (k == "--micro-batches")
      a.m = std::stoi(next());
    else if (k == "--chunks")
      a.chunks = std::stoi(next());
    else if (k == "--activation-checkpointing")
      a.activationCheckpointing = true;
    else
      SHOAL_THROW(InvalidArgument, "unknown argument {}", k);
  }
  return a;
}

constexpr int64_t kBatch = 22;  // not a multiple of most micro-batch counts: uneven splits

torch::nn::Sequential smallModel() {
  torch::manual_seed(7);
  return shoal::train::residualMlp(/*blocks=*/6, /*hidden=*/16);
}

torch::Tensor crossEntropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// The global batch of step k (the same on every rank).
std::pair<torch::Tensor, torch::Tensor> batch(int k) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  return {torch::randn({kBatch, 1, 28, 28}, gen), torch::randint(0, 10, {kBatch}, gen)};
}

// Replica r's share of a global batch (equal shares: the replicas' average is the batch mean).
torch::Tensor share(const torch::Tensor& t, const pp::Grid& g) {
  SHOAL_CHECK(t.size(0) % g.replicas == 0, "batch {} over {} replicas", t.size(0), g.replicas);
  const int64_t n = t.size(0) / g.replicas;
  return t.narrow(0, g.replica * n, n);
}

torch::optim::SGD makeSgd(std::vector<torch::Tensor> params) {
  return torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
}

// The layers [begin, end) of `net`'s parameters, flattened in order.
std::vector<torch::Tensor> layerParams(torch::nn::Sequential& net, int begin, int end) {
  std::vector<torch::Tensor> out;
  for (int l = begin; l < end; ++l) {
    for (auto& p : net->ptr(static_cast<size_t>(l))->parameters()) out.push_back(p);
  }
  return out;
}

int equivalence(const Args& a, const shoal::World& world) {
  pp::Grid grid = pp::makeGrid(world.group, a.stages);
  // The one-process reference, on every rank (the model is small).
  auto reference = smallModel();
  {
    auto opt = makeSgd(reference->parameters());
    for (int k = 0; k < a.steps; ++k) {
      auto [x, y] = batch(k);
      opt.zero_grad();
      crossEntropy(reference->forward(x), y).backward();
      opt.step();
    }
  }
  std::vector<int> counts;
  if (a.microBatches.empty()) {
    counts = {1, a.stages, 2 * a.stages + 1};
  } else {
    for (auto& c : splitList(a.microBatches)) counts.push_back(std::stoi(c));
  }
  int failures = 0;
  for (const auto& schedule : splitList(a.schedules)) {
    for (int m : counts) {
      for (bool ckpt : {false, true}) {
        const std::string config = fmt::format("{} p={} m={} replicas={}{}", schedule, a.stages, m,
                                               grid.replicas, ckpt ? " checkpointing" : "");
        auto net = smallModel();
        auto [x0, y0] = batch(0);
        pp::PipelineOptions o;
        o.schedule = schedule;
        o.microBatches = m;
        o.chunks = schedule == "interleaved" ? 2 : 1;
        o.split = a.split == "time" ? pp::SplitMethod::kTime : pp::SplitMethod::kParameters;
        o.checkpointActivations = ckpt;
        o.printPlan = false;
        pp::Pipeline pipe(net, grid, x0.narrow(0, 0, 2), crossEntropy, o);
        auto opt = makeSgd(pipe.parameters());
        double loss = 0;
        for (int k = 0; k < a.steps; ++k) {
          auto [x, y] = batch(k);
          opt.zero_grad();
          loss = pipe.step(share(x, grid), share(y, grid)).item<double>();
          opt.step();
        }
        // Compare this rank's chunks with the same layers of the reference.
        std::string problem;
        for (int c = 0; c < pipe.schedule().chunks; ++c) {
          const int s = pipe.schedule().virtualStage(grid.stage, c);
          auto mine = layerParams(net, pipe.plan().boundaries[s], pipe.plan().boundaries[s + 1]);
          auto ref =
              layerParams(reference, pipe.plan().boundaries[s], pipe.plan().boundaries[s + 1]);
          for (size_t i = 0; i < mine.size() && problem.empty(); ++i) {
            if (!torch::allclose(mine[i], ref[i], 1e-5, 1e-6)) {
              problem = fmt::format("virtual stage {} parameter {} differs by {:.3g}", s, i,
                                    (mine[i] - ref[i]).abs().max().item<double>());
            }
          }
        }
        if (!std::isfinite(loss)) problem = "loss is not finite";
        if (problem.empty()) {
          std::cout << "OK " << config << " (world rank " << world.rank << ")\n";
        } else {
          std::cout << "FAIL " << config << " (world rank " << world.rank << "): " << problem
                    << "\n";
          ++failures;
        }
      }
    }
  }
  std::cout << std::flush;
  return failures == 0 ? 0 : 1;
}

// A layer whose forward sleeps `fwd` ms and backward `bwd` ms: equal-cost stages on a machine
// with fewer cores than ranks.
struct SleepFn : torch::autograd::Function<SleepFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor w, double fwd, double bwd) {
    ctx->saved_data["bwd"] = bwd;
    ctx->save_for_backward({x, w});
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(fwd));
    return x * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(ctx->saved_data["bwd"].toDouble()));
    auto saved = ctx->get_saved_variables();
    return {g[0] * saved[1], (g[0] * saved[0]).sum().reshape({1}), torch::Tensor(),
            torch::Tensor()};
  }
};

struct SleepLayerImpl : torch::nn::Module {
  SleepLayerImpl(double f, double b) : fwd(f), bwd(b) {
    w = register_parameter("w", torch::ones({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return SleepFn::apply(x, w, fwd, bwd); }
  double fwd, bwd;
  torch::Tensor w;
};
TORCH_MODULE(SleepLayer);

int bubble(const Args& a, const shoal::World& world) {
  pp::Grid grid = pp::makeGrid(world.group, a.stages);
  const int v = a.schedule == "interleaved" ? a.chunks : 1;
  torch::nn::Sequential net;
  for (int l = 0; l < a.stages * v; ++l) {
    net->push_back(SleepLayer(a.fwdMs / v, a.bwdMs / v));
  }
  pp::PipelineOptions o;
  o.schedule = a.schedule;
  o.microBatches = a.m;
  o.chunks = v;
  o.split = pp::SplitMethod::kParameters;
  o.printPlan = false;
  auto mse = [](const torch::Tensor& out, const torch::Tensor& t) {
    return torch::mse_loss(out, t);
  };
  pp::Pipeline pipe(net, grid, torch::ones({1, 4}), mse, o);
  std::vector<double> idle;
  int peak = 0;
  int64_t peakBytes = 0;
  for (int k = 0; k < a.steps; ++k) {
    pipe.step(torch::ones({a.m, 4}), torch::zeros({a.m, 4}));
    if (k > 0) idle.push_back(pipe.lastStats().idleFraction());  // the first step warms up
    peak = std::max(peak, pipe.lastStats().peakInFlight);
    peakBytes = std::max(peakBytes, pipe.lastStats().peakActivationBytes);
  }
  std::sort(idle.begin(), idle.end());
  const double formula = a.schedule == "interleaved"
                             ? static_cast<double>(a.stages - 1) / (v * a.m + a.stages - 1)
                             : static_cast<double>(a.stages - 1) / (a.m + a.stages - 1);
  std::cout << fmt::format(
                   "BUBBLE rank {} measured {:.4f} formula {:.4f} peak_in_flight {} "
                   "peak_bytes {}\n",
                   world.rank, idle[idle.size() / 2], formula, peak, peakBytes)
            << std::flush;
  return 0;
}

// Passes its input through, or (once `shift` is set) doubles its width: a stage whose output
// no longer has the planned shape.
struct ShapeShifterImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return shift ? x.repeat({1, 2}) : x; }
  bool shift = false;
};
TORCH_MODULE(ShapeShifter);

int badShape(const Args& a, const shoal::World& world) {
  pp::Grid grid = pp::makeGrid(world.group, 2);
  ShapeShifter shifter;
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(784, 8), shifter,
                            torch::nn::Linear(8, 10));
  pp::PipelineOptions o;
  o.schedule = a.schedule;
  o.microBatches = 2;
  o.split = pp::SplitMethod::kBoundaries;
  o.boundaries = {3};
  o.printPlan = false;
  auto [x, y] = batch(0);
  pp::Pipeline pipe(net, grid, x.narrow(0, 0, 2), crossEntropy, o);
  pipe.step(x, y);
  shifter->shift = true;
  pipe.step(x, y);
  return 0;
}

int train(const Args& a, const shoal::World& world) {
  pp::Grid grid = pp::makeGrid(world.group, a.stages);
  auto net = smallModel();
  auto [x0, y0] = batch(0);
  pp::PipelineOptions o;
  o.schedule = a.schedule;
  o.microBatches = a.m;
  o.chunks = a.chunks;
  o.split = pp::SplitMethod::kParameters;
  o.checkpointActivations = a.activationCheckpointing;
  o.printPlan = world.rank == 0;
  pp::Pipeline pipe(net, grid, x0.narrow(0, 0, 2), crossEntropy, o);
  auto opt = makeSgd(pipe.parameters());
  int start = 0;
  std::unique_ptr<pp::StageCheckpointer> ckpt;
  if (!a.checkpointDir.empty()) {
    ckpt = std::make_unique<pp::StageCheckpointer>(a.checkpointDir, 3, pipe);
    if (a.resume) {
      if (auto progress = ckpt->resumeLatest(opt)) {
        start = static_cast<int>(progress->step);
        if (world.rank == 0) std::cout << "resumed at step " << start << "\n" << std::flush;
      }
    }
  }
  for (int k = start; k < a.steps; ++k) {
    // Only in the first attempt: a job restarted by shoal run --max-restarts goes through.
    if (k == a.crashAtStep && world.rank == a.crashRank && world.restartCount == 0) {
      ::raise(SIGKILL);
    }
    auto [x, y] = batch(k);
    opt.zero_grad();
    pipe.step(share(x, grid), share(y, grid));
    opt.step();
    if (ckpt && (k + 1) % a.checkpointEvery == 0) {
      shoal::train::Progress p;
      p.step = k + 1;
      ckpt->save(opt, p);
    }
  }
  if (!a.saveParams.empty()) {
    std::string path = a.saveParams;  // "%r" is the world rank
    if (auto at = path.find("%r"); at != std::string::npos) {
      path.replace(at, 2, std::to_string(world.rank));
    }
    auto params = pipe.parameters();
    torch::save(params, path);
  }
  std::cout << "DONE rank " << world.rank << "\n" << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    Args a = parse(argc, argv);
    shoal::World world = shoal::init();
    if (a.mode == "equivalence") return equivalence(a, world);
    if (a.mode == "bubble") return bubble(a, world);
    if (a.mode == "train") return train(a, world);
    if (a.mode == "bad-shape") return badShape(a, world);
    SHOAL_THROW(InvalidArgument, "unknown mode {}", a.mode);
  } catch (const shoal::Error& e) {
    std::cerr << "ERROR " << shoal::test::typeName(e) << ": " << e.what() << " [origin "
              << e.origin() << "]\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR " << e.what() << "\n";
    return 1;
  }
}
