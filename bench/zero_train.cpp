// The ZeRO benchmark's program (bench/run_zero.py runs its variants side by side with PyTorch's,
// bench/pytorch_zero.py). One rank of a Shoal job trains an MLP, a torch::nn::Sequential of
// --depth Linear(width, width) layers with a ReLU between consecutive ones (depth x (width² +
// width) parameters; 2048 x 6: 25.2 M), on one random batch per rank drawn once (inputs and
// MSE targets of width features), with Adam, as
//   ddp    train/ddp.h's DistributedDataParallel + makeOptimizer (train/optim.h)
//   zero1  train/zero/zero.h's ZeroDataParallel, stage 1 (optimizer state sharded)
//   zero2  stage 2 (gradients too)
//   zero3  stage 3 (parameters too; forward through ZeroDataParallel::forward)
//     build/shoal run -n 2 -- build/bench/zero_train --variant zero2 --steps 10
//
// Rank 0 prints ONE line:
//   RESULT variant=zero2 ranks=2 width=2048 depth=6 batch=32 params=25178112 steps=10
//          seconds=... samples_per_s=... step_ms=... loss=... param_bytes=... grad_bytes=...
//          optim_bytes=... peak_rss=... peak_rss_max=...
// samples_per_s = steps x batch x ranks / seconds of the timed steps (every rank starts the clock
// after a barrier and stops it after another); step_ms the median over the timed steps of rank
// 0's step time. Memory is rank 0's, right after the last step's backward and before its
// optimizer step (the gradients exist, the optimizer state from the steps before does too):
// ZeRO from MemoryReport; DDP counted the same way, from the tensors (parameters, their .grad,
// Adam's state tensors; each storage once, at its size: DDP's .grad are views into its
// buckets). peak_rss is rank 0's VmHWM, peak_rss_max the largest over the ranks. loss: rank 0's
// loss at the last step; every variant computes the same one (same seed, same data) within
// rounding, so a broken variant shows here before it shows in the timings. rss_start: rank 0's
// VmRSS before the model is built (libraries, the job's connections); peak_rss_built: its VmHWM
// once the model and its wrapper (and DDP's optimizer) are built, before the first step.
//
// bench/run_zero.py also runs it under a per-process memory limit to find the largest model each
// variant trains: a rank that cannot allocate exits 3 (std::bad_alloc, "out of memory") or is
// killed by the kernel; the other ranks are then killed by `shoal run`.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/ddp.h"
#include "train/optim.h"
#include "train/zero/zero.h"

using namespace shoal;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string variant = "ddp";
  int64_t width = 2048, depth = 6, batch = 32;
  int steps = 10, warmup = 3, threads = 1;
  double lr = 1e-3;
  uint64_t seed = 1;
  size_t bucketMb = 25;
  bool mallocTuning = true, traceMemory = false;
};

torch::nn::Sequential makeMlp(int64_t width, int64_t depth) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < depth; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    if (i + 1 < depth) net->push_back(torch::nn::ReLU());
  }
  return net;
}

// Bytes of the distinct storages behind `tensors` (views into one bucket count once).
int64_t storageBytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_map<const void*, int64_t> seen;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto& s = t.storage();
    seen[s.data()] = static_cast<int64_t>(s.nbytes());
  }
  int64_t sum = 0;
  for (const auto& [ptr, bytes] : seen) sum += bytes;
  return sum;
}

// Adam's (or AdamW's) state tensors: what makeOptimizer's kAdam keeps per parameter.
std::vector<torch::Tensor> adamState(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& [key, state] : opt.state()) {
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      out.insert(out.end(), {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()});
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      out.insert(out.end(), {w->exp_avg(), w->exp_avg_sq(), w->max_exp_avg_sq()});
    } else {
      SHOAL_THROW(InvalidArgument, "zero_train: optimizer state of an unexpected type");
    }
  }
  return out;
}

// A field of /proc/self/status in bytes: VmHWM (the peak resident set), VmRSS.
int64_t statusBytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}
int64_t peakRss() { return statusBytes("VmHWM"); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int trainMlp(const World& world, const Options& o) {
  const int64_t rssStart = statusBytes("VmRSS");
  torch::manual_seed(o.seed);  // the same initial model on every rank and in every variant
  auto net = makeMlp(o.width, o.depth);
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  // Each rank its own batch, the same in every variant.
  at::Generator gen = at::detail::createCPUGenerator(o.seed * 1000 + 7 + world.rank);
  const torch::Tensor x = at::normal(0.0, 1.0, {o.batch, o.width}, gen);
  const torch::Tensor y = at::normal(0.0, 1.0, {o.batch, o.width}, gen);

  const bool ddpVariant = o.variant == "ddp";
  const OptimizerOptions adam{OptimizerKind::kAdam, o.lr};
  std::optional<train::DistributedDataParallel> ddp;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::optional<train::zero::ZeroDataParallel> zero;
  if (ddpVariant) {
    train::DdpOptions d;
    ddp.emplace(net.ptr(), world.group, d);
    opt = train::makeOptimizer(net->parameters(), adam);
  } else {
    train::zero::ZeroOptions z;
    z.stage = o.variant.back() - '0';
    z.optimizer = adam;
    z.bucketBytes = o.bucketMb << 20;
    zero.emplace(net, world.group, z);
  }
  const int64_t peakBuilt = peakRss();

  // Rank 0's memory after the last backward: parameters, gradients, optimizer state, peak RSS.
  int64_t mem[4] = {0, 0, 0, 0};
  std::vector<double> stepS;
  double loss = 0;
  Clock::time_point start;
  for (int k = 0; k < o.warmup + o.steps; ++k) {
    if (k == o.warmup) {
      comm::barrier(*world.group);
      start = Clock::now();
    }
    const auto t0 = Clock::now();
    const bool last = k + 1 == o.warmup + o.steps;
    torch::Tensor l;
    auto trace = [&](const char* phase) {
      if (o.traceMemory && world.rank == 0) {
        std::fprintf(stderr, "MEMORY step=%d after=%s rss=%lld peak_rss=%lld\n", k, phase,
                     static_cast<long long>(statusBytes("VmRSS")),
                     static_cast<long long>(peakRss()));
      }
    };
    if (ddp) {
      opt->zero_grad();
      ddp->beforeForward();
      l = torch::mse_loss(net->forward(x), y);
      trace("forward");
      ddp->backward(l);
      trace("backward");
      if (last) {
        mem[0] = storageBytes(net->parameters());
        std::vector<torch::Tensor> grads;
        for (const auto& p : net->parameters()) grads.push_back(p.grad());
        mem[1] = storageBytes(grads);
        mem[2] = storageBytes(adamState(*opt));
        mem[3] = peakRss();
      }
      opt->step();
      trace("step");
    } else {
      zero->beforeForward();
      l = torch::mse_loss(o.variant == "zero3" ? zero->forward(x) : net->forward(x), y);
      trace("forward");
      zero->backward(l);
      trace("backward");
      if (last) {
        const auto r = zero->memory();
        mem[0] = r.parameterBytes;
        mem[1] = r.gradientBytes;
        mem[2] = r.optimizerBytes;
        mem[3] = std::max(r.peakResidentBytes, peakRss());
      }
      zero->step();
      trace("step");
    }
    loss = l.item<double>();
    if (k >= o.warmup) stepS.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  comm::barrier(*world.group);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t peakMax = mem[3];
  comm::allreduce(*world.group, &peakMax, 1, DataType::kInt64, ReduceOp::kMax);
  if (world.rank == 0) {
    std::printf(
        "RESULT variant=%s ranks=%d width=%lld depth=%lld batch=%lld params=%lld steps=%d "
        "seconds=%.4f samples_per_s=%.2f step_ms=%.2f loss=%.6g param_bytes=%lld grad_bytes=%lld "
        "optim_bytes=%lld peak_rss=%lld peak_rss_max=%lld rss_start=%lld peak_rss_built=%lld\n",
        o.variant.c_str(), world.size, static_cast<long long>(o.width),
        static_cast<long long>(o.depth), static_cast<long long>(o.batch),
        static_cast<long long>(params), o.steps, seconds,
        static_cast<double>(o.steps * o.batch * world.size) / seconds, median(stepS) * 1e3, loss,
        static_cast<long long>(mem[0]), static_cast<long long>(mem[1]),
        static_cast<long long>(mem[2]), static_cast<long long>(mem[3]),
        static_cast<long long>(peakMax), static_cast<long long>(rssStart),
        static_cast<long long>(peakBuilt));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the ZeRO benchmark's training loop (a rank of `shoal run`)"};
  Options o;
  app.add_option("--variant", o.variant)->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3"}));
  app.add_option("--width", o.width, "features of every Linear")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--depth", o.depth, "Linear layers")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--batch", o.batch, "samples per rank")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::Range(1, 1 << 20));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 1 << 20));
  app.add_option("--lr", o.lr)->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed);
  app.add_option("--bucket-mb", o.bucketMb, "ZeRO stages 1-2: bucket (shard unit) MiB")
      ->check(CLI::Range(size_t{1}, size_t{4096}));
  app.add_option("--threads", o.threads, "intra-op threads (torch::set_num_threads)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--trace-memory", o.traceMemory,
               "rank 0: VmRSS and VmHWM after every forward, backward and step (stderr)");
  app.add_flag(
      "--no-malloc-tuning", [&](int64_t) { o.mallocTuning = false; },
      "leave glibc malloc at its defaults (train/allocator.h not applied)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.mallocTuning) train::keepFreedMemoryForReuse();
    torch::set_num_threads(o.threads);
    auto world = init();
    return trainMlp(world, o);
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr, "zero_train: out of memory (%s)\n", e.what());
    return 3;
  } catch (const c10::Error& e) {
    // libtorch reports a failed allocation as c10::Error ("DefaultCPUAllocator: can't allocate
    // memory"); run_zero.py tells it from other failures by the exit code.
    const bool oom = std::string(e.what()).find("can't allocate memory") != std::string::npos;
    std::fprintf(stderr, "zero_train: %s%s\n", oom ? "out of memory: " : "",
                 e.what_without_backtrace());
    return oom ? 3 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_train: %s\n", e.what());
    return 1;
  }
}
