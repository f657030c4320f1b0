// The tensor-parallel benchmark's program (bench/run_tensor_parallel.py runs its configurations
// side by side). Three modes, each printing ONE JSON line on world rank 0:
//
//   block      one transformer block (train/gpt.h's GptBlock: pre-norm causal attention and a
//              GELU feed-forward, Megatron's split) built from full weights, its layers split
//              over every rank of the world (tensor parallelism = world size; one process is
//              the unsplit block). Times forward + backward per iteration on a fixed input and
//              output gradient; tokens/s = batch * sequence / iteration time. Per rank, from
//              the block's CommCounters: the all-reduces per iteration (forward and backward,
//              checked against Megatron's 2 + 2: exit 1 if they differ), their bytes and the
//              wall time inside them, forward and backward apart.
//     build/bench/tensor_parallel --mode block --threads 2
//     build/shoal run -n 2 -- build/bench/tensor_parallel --mode block --threads 1
//   allreduce  a plain all-reduce of --bytes (the block's all-reduce size) between the ranks,
//              back to back: what the transport costs without compute around it.
//     build/shoal run -n 2 -- build/bench/tensor_parallel --mode allreduce --bytes 4194304
//   model      the GPT of train/gpt.h trained with HybridParallel on ByteCorpus batches as
//              examples/gpt_fortunes.cpp does (AdamW lr 3e-3, weight decay 0.01; the pipeline
//              plans by measured time) on a data x pipeline x tensor grid; tokens/s = batch *
//              sequence * steps / seconds of the timed steps (optimizer included), and per rank the
//              time inside the tensor-parallel collectives per step.
//     build/shoal run -n 4 -- build/bench/tensor_parallel --mode model --pipeline 2 --tensor 2
//
// --precision bf16 runs forward under libtorch's CPU autocast in bfloat16 (linears and
// matmuls in bf16, weights kept in fp32; block: backward outside autocast; model: around
// HybridParallel's construction and each step(), since a pipeline interleaves forward and
// backward inside step(); the cast cache is cleared after each step).
// --no-malloc-tuning leaves glibc's malloc at its defaults (train/allocator.h not applied).
// --threads sets torch::set_num_threads; OMP_NUM_THREADS and OPENBLAS_NUM_THREADS must match
// (the driver sets them): OpenBLAS reads its own variable only.
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/collectives.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/byte_corpus.h"
#include "train/gpt.h"
#include "train/hybrid_parallel.h"
#include "train/process_grid.h"
#include "train/tensor/tensor_group.h"

namespace st = shoal::train;
namespace tp = shoal::train::tensor;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Options {
  std::string mode = "block", precision = "fp32";
  int threads = 1, steps = 10, warmup = 3;
  // block
  int64_t batch = 8, sequence = 128, hidden = 1024, heads = 16, inner = 4096;
  // allreduce
  int64_t bytes = 4 << 20;
  int iters = 50;
  // model
  int64_t vocabulary = 256, layers = 4;
  int data = 1, pipeline = 1, tensor = 1, microBatches = 4;
  std::string schedule = "1f1b";
  bool mallocTuning = true;
  double lr = 3e-3;  // the example's (examples/gpt_fortunes.cpp), as its AdamW weight decay
};

// libtorch's CPU autocast in bf16 while it lives (nothing in fp32); restores the previous state
// and drops the cached bf16 weight copies (the optimizer changes the weights after).
class Autocast {
 public:
  explicit Autocast(bool on)
      : on_(on),
        wasEnabled_(at::autocast::is_cpu_enabled()),
        wasDtype_(at::autocast::get_autocast_cpu_dtype()) {
    if (!on_) return;
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(wasEnabled_);
    at::autocast::set_autocast_cpu_dtype(wasDtype_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_, wasEnabled_;
  at::ScalarType wasDtype_;
};

// Every rank's `mine` (equal lengths), rank-major.
std::vector<std::vector<double>> gatherPerRank(shoal::comm::Group& g, std::vector<double> mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(g.size()));
  shoal::comm::allgather(g, mine.data(), all.data(), mine.size(), shoal::DataType::kFloat64);
  std::vector<std::vector<double>> out;
  for (int r = 0; r < g.size(); ++r) {
    out.emplace_back(all.begin() + static_cast<ptrdiff_t>(r * mine.size()),
                     all.begin() + static_cast<ptrdiff_t>((r + 1) * mine.size()));
  }
  return out;
}

nlohmann::json column(const std::vector<std::vector<double>>& perRank, size_t field) {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& r : perRank) c.push_back(r[field]);
  return c;
}

// Megatron's count per block and iteration (Note: the block's own two regions, attention and
// feed-forward, each one all-reduce forward and one backward).
constexpr int64_t kForwardPerBlock = 2, kBackwardPerBlock = 2;

int block(const shoal::World& world, const Options& o) {
  tp::TensorGroup tg{world.size > 1 ? world.group : nullptr};
  const bool bf16 = o.precision == "bf16";
  const int64_t h = o.hidden, f = o.inner;
  at::Generator gen = at::detail::createCPUGenerator(1);
  auto normal = [&](std::vector<int64_t> shape, double s) {
    return at::normal(0.0, s, shape, gen);
  };
  tp::AttentionWeights attn{normal({3 * h, h}, 0.02), torch::zeros({3 * h}),
                            normal({h, h}, 0.02 / std::sqrt(2.0)), torch::zeros({h})};
  tp::MlpWeights ff{normal({f, h}, 0.02), torch::zeros({f}), normal({h, f}, 0.02 / std::sqrt(2.0)),
                    torch::zeros({h})};
  st::GptBlock net(attn, ff, o.heads, tg);
  // The input and the output's gradient are replicated on every tensor-parallel rank.
  const torch::Tensor input = normal({o.batch, o.sequence, h}, 1.0);
  const torch::Tensor gradOut = normal({o.batch, o.sequence, h}, 1.0);
  std::vector<double> iterS, fwdS, bwdS, fwdCommS, bwdCommS;
  int64_t fwdCount = 0, bwdCount = 0, gathers = 0, bytes = 0;
  Clock::time_point timedStart;
  for (int k = 0; k < o.warmup + o.steps; ++k) {
    if (k == o.warmup) {
      shoal::comm::barrier(*world.group);
      timedStart = Clock::now();
    }
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    tg.counters->reset();
    const auto t0 = Clock::now();
    torch::Tensor x = input.detach().requires_grad_(true);  // a block inside a model
    torch::Tensor out;
    {
      Autocast autocast(bf16);
      out = net->forward(x);
    }
    const double fwd = since(t0);
    const tp::CommCounters afterForward = *tg.counters;
    const auto t1 = Clock::now();
    out.backward(gradOut.to(out.scalar_type()));
    const double bwd = since(t1);
    const tp::CommCounters c = *tg.counters;
    if (k < o.warmup) continue;
    iterS.push_back(fwd + bwd);
    fwdS.push_back(fwd);
    bwdS.push_back(bwd);
    fwdCommS.push_back(afterForward.seconds);
    bwdCommS.push_back(c.seconds - afterForward.seconds);
    fwdCount += c.forwardAllreduces;
    bwdCount += c.backwardAllreduces;
    gathers += c.allgathers;
    bytes += c.bytes;
  }
  const double seconds = since(timedStart);
  const double steps = o.steps;
  // Per rank: medians per iteration (ms), counts and bytes per iteration.
  auto perRank =
      gatherPerRank(*world.group, {median(iterS) * 1e3, median(fwdS) * 1e3, median(bwdS) * 1e3,
                                   median(fwdCommS) * 1e3, median(bwdCommS) * 1e3, fwdCount / steps,
                                   bwdCount / steps, gathers / steps, bytes / steps,
                                   o.steps * o.batch * o.sequence / seconds});
  // Megatron's count: 2 forward and 2 backward all-reduces per block, none without parallelism.
  const int64_t wantF = tg.parallel() ? kForwardPerBlock : 0,
                wantB = tg.parallel() ? kBackwardPerBlock : 0;
  bool countsOk = true;
  for (int r = 0; r < world.size; ++r) {
    const auto& v = perRank[static_cast<size_t>(r)];
    if (v[5] != wantF || v[6] != wantB || v[7] != 0) {
      countsOk = false;
      if (world.rank == 0) {
        std::cerr << fmt::format(
            "tensor_parallel: rank {}: {} forward and {} backward all-reduces and {} all-gathers "
            "per block iteration, Megatron's count is {} and {} and 0\n",
            r, v[5], v[6], v[7], wantF, wantB);
      }
    }
  }
  nlohmann::json row;
  row["mode"] = "block";
  row["precision"] = o.precision;
  row["tensor"] = tg.size();
  row["processes"] = world.size;
  row["threads"] = o.threads;
  row["batch"] = o.batch;
  row["sequence"] = o.sequence;
  row["hidden"] = h;
  row["heads"] = o.heads;
  row["inner"] = f;
  row["steps"] = o.steps;
  row["tokens_per_second"] = o.steps * o.batch * o.sequence / seconds;
  row["iter_ms_median"] = median(iterS) * 1e3;
  row["iter_ms"] = column(perRank, 0);
  row["forward_ms"] = column(perRank, 1);
  row["backward_ms"] = column(perRank, 2);
  row["allreduce_forward_ms"] = column(perRank, 3);
  row["allreduce_backward_ms"] = column(perRank, 4);
  row["allreduces_forward_per_iter"] = column(perRank, 5);
  row["allreduces_backward_per_iter"] = column(perRank, 6);
  row["allgathers_per_iter"] = column(perRank, 7);
  row["allreduce_bytes_per_iter"] = column(perRank, 8);
  row["counts_match_megatron"] = countsOk;
  if (world.rank == 0) std::cout << row.dump() << std::endl;
  return countsOk ? 0 : 1;
}

int allreduce(const shoal::World& world, const Options& o) {
  const bool bf16 = o.precision == "bf16";
  const int64_t count = o.bytes / (bf16 ? 2 : 4);
  const auto type = bf16 ? shoal::DataType::kBFloat16 : shoal::DataType::kFloat32;
  torch::Tensor t = torch::ones({count}, bf16 ? torch::kBFloat16 : torch::kFloat32);
  // One checked call (ones sum to the world size exactly), then zeros, whose sum stays exact.
  shoal::comm::allreduce(*world.group, t.data_ptr(), count, type, shoal::ReduceOp::kSum);
  const bool ok = t.eq(world.size).all().item<bool>();
  t.zero_();
  for (int i = 0; i < 5; ++i)
    shoal::comm::allreduce(*world.group, t.data_ptr(), count, type, shoal::ReduceOp::kSum);
  shoal::comm::barrier(*world.group);
  std::vector<double> callS;
  const auto start = Clock::now();
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    shoal::comm::allreduce(*world.group, t.data_ptr(), count, type, shoal::ReduceOp::kSum);
    callS.push_back(since(t0));
  }
  const double total = since(start);
  auto perRank = gatherPerRank(*world.group, {median(callS) * 1e3, ok ? 1.0 : 0.0});
  bool allOk = true;
  for (const auto& v : perRank) allOk = allOk && v[1] == 1.0;
  nlohmann::json row;
  row["mode"] = "allreduce";
  row["precision"] = o.precision;
  row["processes"] = world.size;
  row["bytes"] = count * (bf16 ? 2 : 4);
  row["iters"] = o.iters;
  row["call_ms_median"] = median(callS) * 1e3;
  row["call_ms_mean"] = total / o.iters * 1e3;
  row["call_ms"] = column(perRank, 0);
  // algbw: bytes / time (nccl-tests' name); the bus bandwidth is the same at 2 ranks.
  row["algbw_gbps"] = count * (bf16 ? 2 : 4) / median(callS) / 1e9;
  row["verified"] = allOk;
  if (world.rank == 0) std::cout << row.dump() << std::endl;
  return allOk ? 0 : 1;
}

int model(const shoal::World& world, const Options& o) {
  const bool bf16 = o.precision == "bf16";
  st::ProcessGrid grid = st::makeProcessGrid(
      world.group, {.data = o.data, .pipeline = o.pipeline, .tensor = o.tensor});
  const st::GptConfig c{.vocabulary = o.vocabulary,
                        .sequence = o.sequence,
                        .hidden = o.hidden,
                        .heads = o.heads,
                        .layers = o.layers,
                        .inner = o.inner};
  tp::TensorGroup tg{grid.tensor};
  auto net = st::makeGpt(c, tg);
  // The batches, made before the clock starts (data loading is not measured).
  st::ByteCorpus corpus;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int k = 0; k < o.warmup + o.steps; ++k) {
    torch::Tensor b =
        corpus.batch(o.batch, c.sequence, static_cast<uint64_t>(k), st::ByteCorpus::Split::kTrain);
    batches.emplace_back(b.narrow(1, 0, c.sequence).contiguous(),
                         b.narrow(1, 1, c.sequence).contiguous());
  }
  st::HybridOptions options;
  options.pipeline.schedule = o.schedule;
  options.pipeline.microBatches = o.microBatches;
  options.pipeline.chunks = o.schedule == "interleaved" ? 2 : 1;
  options.pipeline.printPlan = false;
  const int64_t micro = std::max<int64_t>(1, o.batch / o.data / o.microBatches);
  std::optional<st::HybridParallel> hybrid;
  {
    Autocast autocast(bf16);  // the plan records the activations' dtypes
    hybrid.emplace(
        net, grid, batches[0].first.narrow(0, 0, micro),
        [&](const torch::Tensor& out, const torch::Tensor& y) {
          return st::gptLoss(out, y, c, tg);
        },
        options);
  }
  torch::optim::AdamW opt(hybrid->parameters(),
                          torch::optim::AdamWOptions(o.lr).weight_decay(0.01));
  std::vector<double> stepS, commS;
  double loss = 0;
  Clock::time_point timedStart;
  int64_t fwdCount = 0, bwdCount = 0, gathers = 0, bytes = 0;
  for (int k = 0; k < o.warmup + o.steps; ++k) {
    if (k == o.warmup) {
      shoal::comm::barrier(*world.group);
      timedStart = Clock::now();
    }
    tg.counters->reset();
    const auto t0 = Clock::now();
    opt.zero_grad();
    {
      Autocast autocast(bf16);
      loss = hybrid->step(batches[static_cast<size_t>(k)].first,
                          batches[static_cast<size_t>(k)].second);
    }
    opt.step();
    if (k < o.warmup) continue;
    stepS.push_back(since(t0));
    commS.push_back(tg.counters->seconds);
    fwdCount += tg.counters->forwardAllreduces;
    bwdCount += tg.counters->backwardAllreduces;
    gathers += tg.counters->allgathers;
    bytes += tg.counters->bytes;
  }
  const double seconds = since(timedStart);
  const double steps = o.steps;
  auto perRank =
      gatherPerRank(*world.group, {median(stepS) * 1e3, median(commS) * 1e3, fwdCount / steps,
                                   bwdCount / steps, gathers / steps, bytes / steps});
  nlohmann::json row;
  row["mode"] = "model";
  row["precision"] = o.precision;
  row["config"] = c.describe();
  row["parameters"] = c.parameterCount();
  row["processes"] = world.size;
  row["threads"] = o.threads;
  row["data"] = grid.dataSize;
  row["pipeline"] = grid.pipelineSize;
  row["tensor"] = grid.tensorSize;
  row["schedule"] = grid.pipelineSize > 1 ? o.schedule : "none";
  row["micro_batches"] = grid.pipelineSize > 1 ? o.microBatches : 1;
  row["batch"] = o.batch;
  row["sequence"] = c.sequence;
  row["steps"] = o.steps;
  row["tokens_per_second"] = o.steps * o.batch * c.sequence / seconds;
  row["step_ms_median"] = median(stepS) * 1e3;
  row["loss"] = loss;
  row["step_ms"] = column(perRank, 0);
  row["tp_comm_ms"] = column(perRank, 1);  // all-reduces and all-gathers of the tensor group
  row["tp_allreduces_forward_per_step"] = column(perRank, 2);
  row["tp_allreduces_backward_per_step"] = column(perRank, 3);
  row["tp_allgathers_per_step"] = column(perRank, 4);
  row["tp_bytes_per_step"] = column(perRank, 5);
  if (auto* pipe = hybrid->pipeline()) row["plan_boundaries"] = pipe->plan().boundaries;
  if (world.rank == 0) std::cout << row.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensor-parallel benchmark"};
  Options o;
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"block", "allreduce", "model"}));
  app.add_option("--precision", o.precision)->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--threads", o.threads, "intra-op threads (torch::set_num_threads)");
  app.add_option("--steps", o.steps, "timed iterations");
  app.add_option("--warmup", o.warmup);
  app.add_option("--batch", o.batch);
  app.add_option("--sequence", o.sequence);
  app.add_option("--hidden", o.hidden);
  app.add_option("--heads", o.heads);
  app.add_option("--inner", o.inner, "feed-forward size (model: 0 = 4 x hidden)");
  app.add_option("--bytes", o.bytes, "allreduce: payload bytes");
  app.add_option("--iters", o.iters, "allreduce: timed calls");
  app.add_option("--vocabulary", o.vocabulary);
  app.add_option("--layers", o.layers);
  app.add_option("--data", o.data, "model: data-parallel size (0: world / (pipeline x tensor))");
  app.add_option("--pipeline", o.pipeline);
  app.add_option("--tensor", o.tensor);
  app.add_option("--micro-batches", o.microBatches);
  app.add_option("--schedule", o.schedule)->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--lr", o.lr);
  bool noMallocTuning = false;
  app.add_flag("--no-malloc-tuning", noMallocTuning,
               "leave glibc malloc at its defaults (train/allocator.h not applied)");
  CLI11_PARSE(app, argc, argv);
  o.mallocTuning = !noMallocTuning;
  try {
    torch::set_num_threads(o.threads);
    // Activations reuse freed heap memory instead of fresh mmap pages every step (as
    // bench/pipeline_train.cpp; train/allocator.h has the numbers).
    if (o.mallocTuning) shoal::train::keepFreedMemoryForReuse();
    auto world = shoal::init();
    if (o.mode == "block") return block(world, o);
    if (o.mode == "allreduce") return allreduce(world, o);
    return model(world, o);
  } catch (const std::exception& e) {
    std::cerr << "tensor_parallel: " << e.what() << "\n";
    return 1;
  }
}
