// Mixed precision on this CPU (train/mixed_precision.h): milliseconds per training step and the
// loss reached, fp32 against bf16 (libtorch's CPU autocast) and fp16 (the emulation: fp16
// values, fp32 arithmetic, dynamic loss scaling), on two small workloads trained from the same
// initialization on the same batches:
//
//   mlp          the pipeline example's residual MLP (train/residual_mlp.h): 784 -> 256,
//                4 blocks of LayerNorm + two 256x256 linears, -> 10; batch 128
//   transformer  embedding (256 tokens, width 128), 2 encoder layers (4 heads, feed-forward
//                512, post-norm), mean pooling, -> 10; 32 sequences of 32 tokens per batch
//
// Labels come from a fixed random teacher plus noise, so there is something to learn and a
// floor above zero; every step draws a fresh batch. Each (workload, precision) trains --runs times
// from the same initialization; ms/step is the median step time of a run (after --warmup steps),
// and the table gives the median of the runs with their min and max, and the median CPU time per
// step of this process (which moves less than the wall clock when other programs share the cores).
// The loss is the trained weights' mean loss on a held-out set, evaluated in fp32 (no autocast, no
// rounding), with its accuracy. fp16 also reports the steps its loss scaler skipped and its final
// scale. One process, one intra-op thread; prints a markdown table.
#include "train/mixed_precision.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "train/allocator.h"
#include "train/residual_mlp.h"

using namespace shoal;
using train::Precision;

namespace {

// Where fp16 mode rounds activations: between the model's layers (Note [What fp16 is on this
// CPU]); the weights and their gradients through Fp16Weights.
torch::Tensor boundary(const torch::Tensor& x, bool half) {
  return half ? train::roundToHalf(x) : x;
}

struct MlpImpl : torch::nn::Module {
  MlpImpl() : seq(train::residualMlp(/*blocks=*/4, /*hidden=*/256)) { register_module("seq", seq); }
  torch::Tensor forward(torch::Tensor x, bool half) {
    for (auto& layer : *seq) x = boundary(layer.forward(x), half);
    return x;
  }
  torch::nn::Sequential seq;
};
TORCH_MODULE(Mlp);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl()
      : embed(256, 128),
        layer1(torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(512).dropout(0)),
        layer2(torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(512).dropout(0)),
        head(128, 10) {
    register_module("embed", embed);
    register_module("layer1", layer1);
    register_module("layer2", layer2);
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& tokens, bool half) {
    torch::Tensor x = boundary(embed(tokens).transpose(0, 1), half);  // (sequence, batch, width)
    x = boundary(layer1(x), half);
    x = boundary(layer2(x), half);
    return boundary(head(x.mean(0)), half);
  }
  torch::nn::Embedding embed;
  torch::nn::TransformerEncoderLayer layer1, layer2;
  torch::nn::Linear head;
};
TORCH_MODULE(Transformer);

// A task: fresh batches from a fixed random teacher plus noise (every step sees new samples, so
// the held-out loss measures learning, not memorization), and a held-out set.
struct Task {
  virtual ~Task() = default;
  virtual std::pair<torch::Tensor, torch::Tensor> sample(int64_t n, uint64_t seed) const = 0;
  int64_t batch = 0;
};

struct MlpTask : Task {
  MlpTask() {
    batch = 128;
    auto gen = at::detail::createCPUGenerator(17);
    teacher = torch::randn({28 * 28, 10}, gen) / 28.0;
  }
  std::pair<torch::Tensor, torch::Tensor> sample(int64_t n, uint64_t seed) const override {
    auto gen = at::detail::createCPUGenerator(seed);
    torch::Tensor x = torch::randn({n, 1, 28, 28}, gen);
    return {x, (x.flatten(1).mm(teacher) + 0.5 * torch::randn({n, 10}, gen)).argmax(1)};
  }
  torch::Tensor teacher;
};

struct TransformerTask : Task {
  TransformerTask() {
    batch = 32;
    auto gen = at::detail::createCPUGenerator(23);
    scores = torch::randn({256, 10}, gen);
  }
  // The teacher scores each token, sums over the sequence, and adds noise.
  std::pair<torch::Tensor, torch::Tensor> sample(int64_t n, uint64_t seed) const override {
    auto gen = at::detail::createCPUGenerator(seed);
    torch::Tensor tokens = torch::randint(0, 256, {n, 32}, gen);
    torch::Tensor logits = scores.index_select(0, tokens.flatten()).view({n, 32, 10}).sum(1) / 5.0;
    return {tokens, (logits + 0.5 * torch::randn({n, 10}, gen)).argmax(1)};
  }
  torch::Tensor scores;
};

double processCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct RunResult {
  double msPerStep;     // median over the run's timed steps, wall clock
  double cpuMsPerStep;  // the same in CPU time of this process (moves less with other load)
  double testLoss, testAccuracy;
  int64_t skipped;
  double scale;
};

template <class Net>
RunResult trainOnce(const Task& task, Precision p, int steps, int warmup) {
  torch::manual_seed(5);
  Net net;
  const bool half = p == Precision::kFloat16;
  auto params = net->parameters();
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-3));
  train::LossScaler scaler(p);
  train::Fp16Weights fp16(params);
  std::vector<double> ms, cpuMs;
  for (int k = 0; k < steps; ++k) {
    const auto [x, y] = task.sample(task.batch, 1000 + static_cast<uint64_t>(k));
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = processCpuMs();
    opt.zero_grad();
    {
      std::optional<train::Fp16Weights::Scope> scope;
      if (half) scope.emplace(fp16.scope());
      torch::Tensor loss;
      {
        train::AutocastGuard autocast(p);
        loss = torch::nn::functional::cross_entropy(net->forward(x, half), y);
      }
      scaler.scale(loss).backward();
    }
    scaler.step(opt, params, {});
    const auto t1 = std::chrono::steady_clock::now();
    if (k >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpuMs.push_back(processCpuMs() - c0);
    }
  }
  torch::NoGradGuard noGrad;
  const auto [testX, testY] = task.sample(2048, 7);
  torch::Tensor logits = net->forward(testX, false);
  return {median(ms),
          median(cpuMs),
          torch::nn::functional::cross_entropy(logits, testY).item<double>(),
          logits.argmax(1).eq(testY).to(torch::kFloat64).mean().item<double>(),
          scaler.skippedSteps(),
          scaler.currentScale()};
}

bool cpuHas(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixed precision on the CPU: ms/step and loss of fp32, bf16 and fp16"};
  int steps = 300, warmup = 20, runs = 3;
  std::vector<std::string> workloads{"mlp", "transformer"}, precisions{"fp32", "bf16", "fp16"};
  app.add_option("--steps", steps)->check(CLI::Range(2, 100000));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 100000));
  app.add_option("--runs", runs)->check(CLI::Range(1, 100));
  app.add_option("--workloads", workloads)->delimiter(',');
  app.add_option("--precisions", precisions)->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    if (warmup >= steps) SHOAL_THROW(InvalidArgument, "--warmup {} >= --steps {}", warmup, steps);
    train::keepFreedMemoryForReuse();
    torch::set_num_threads(1);
    std::printf("CPU flags: avx512_bf16 %s, amx_bf16 %s; libtorch intra-op threads %d\n\n",
                cpuHas("avx512_bf16") ? "yes" : "no", cpuHas("amx_bf16") ? "yes" : "no",
                torch::get_num_threads());
    std::printf(
        "| workload | precision | ms/step (median of %d runs) | min..max | vs fp32 | CPU ms/step | "
        "test loss | test accuracy | skipped steps | final scale |\n",
        runs);
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& w : workloads) {
      if (w != "mlp" && w != "transformer") {
        SHOAL_THROW(InvalidArgument, "--workloads: unknown '{}' (mlp, transformer)", w);
      }
      std::unique_ptr<Task> task;
      if (w == "mlp") task = std::make_unique<MlpTask>();
      if (w == "transformer") task = std::make_unique<TransformerTask>();
      // Runs of the precisions interleave (fp32, bf16, fp16, fp32, ...), so that load from other
      // programs that comes and goes weighs on each precision alike.
      std::vector<std::vector<RunResult>> rs(precisions.size());
      for (int r = 0; r < runs; ++r) {
        for (size_t i = 0; i < precisions.size(); ++i) {
          const Precision p = train::parsePrecision(precisions[i]);
          rs[i].push_back(w == "mlp" ? trainOnce<Mlp>(*task, p, steps, warmup)
                                     : trainOnce<Transformer>(*task, p, steps, warmup));
        }
      }
      double fp32Ms = 0;
      for (size_t i = 0; i < precisions.size(); ++i) {
        std::vector<double> ms, cpuMs;
        for (const auto& r : rs[i]) {
          ms.push_back(r.msPerStep);
          cpuMs.push_back(r.cpuMsPerStep);
        }
        std::sort(ms.begin(), ms.end());
        const double wall = median(ms);
        if (precisions[i] == "fp32") fp32Ms = wall;
        // Same initialization and batches: the runs differ in time only, not in loss.
        const RunResult& r = rs[i].front();
        std::printf("| %s | %s | %.2f | %.2f..%.2f | %s | %.2f | %.4f | %.1f%% | %lld | %g |\n",
                    w.c_str(), precisions[i].c_str(), wall, ms.front(), ms.back(),
                    fp32Ms > 0 ? fmt::format("{:.2f}x", wall / fp32Ms).c_str() : "-", median(cpuMs),
                    r.testLoss, 100 * r.testAccuracy, static_cast<long long>(r.skipped), r.scale);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR %s\n", e.what());
    return 1;
  }
  return 0;
}
