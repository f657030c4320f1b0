// The pipeline benchmark's training program (bench/run_pipeline.py runs it side by side with
// PyTorch's pipelines): the example's residual MLP on fixed synthetic batches, so that data
// loading is out of the measurement, one intra-op thread per process.
//
//   build/bench/pipeline_train --schedule none ...                    # plain libtorch
//   build/shoal run -n 2 -- build/bench/pipeline_train --schedule 1f1b --micro-batches 8 ...
//
// Prints one JSON line (world rank 0): samples/s over the timed steps (after --warmup), the
// median step time, the final loss, and per rank the measured bubble (idle fraction, median
// over the timed steps), the forward + backward milliseconds per step, the peak number of
// micro-batches in flight and the peak heap bytes above the step's start, with the schedule's
// bubble formula. --trace writes the last step's timeline of every rank (Chrome trace JSON).
#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "comm/collectives.h"
#include "run/init.h"
#include "train/allocator.h"
#include "train/pipeline/pipeline.h"
#include "train/pipeline/trace.h"
#include "train/residual_mlp.h"

namespace pp = shoal::train::pipeline;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t heapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

torch::Tensor crossEntropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipeline benchmark"};
  std::string schedule = "1f1b", trace, split = "time";
  int chunks = 0, microBatches = 8, steps = 30, warmup = 5, blocks = 12, hidden = 256;
  int64_t batch = 256;
  app.add_option("--schedule", schedule)
      ->check(CLI::IsMember({"none", "gpipe", "1f1b", "interleaved"}));
  app.add_option("--chunks", chunks);
  app.add_option("--micro-batches", microBatches);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--blocks", blocks);
  app.add_option("--hidden", hidden);
  app.add_option("--split", split)->check(CLI::IsMember({"time", "parameters"}));
  bool checkpointActivations = false;
  app.add_flag("--checkpoint-activations", checkpointActivations);
  std::vector<int> boundaries;
  app.add_option("--boundaries", boundaries, "first layer of each stage after the first")
      ->delimiter(',');
  app.add_option("--trace", trace);
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    shoal::train::keepFreedMemoryForReuse();
    auto world = shoal::init();
    torch::manual_seed(1);
    auto net = shoal::train::residualMlp(blocks, hidden);
    // A few fixed batches, reused.
    std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
    for (int i = 0; i < 4; ++i) {
      data.emplace_back(torch::randn({batch, 1, 28, 28}), torch::randint(0, 10, {batch}));
    }
    nlohmann::json row;
    row["batch"] = batch;
    row["steps"] = steps;
    row["blocks"] = blocks;
    row["hidden"] = hidden;
    std::vector<double> stepMs, idle, computeMs;
    int peakInFlight = 0;
    int64_t peakBytes = 0;
    double loss = 0;
    std::unique_ptr<pp::Pipeline> pipe;
    std::optional<pp::Grid> grid;
    if (schedule != "none") {
      grid = pp::makeGrid(world.group, world.size);
      pp::PipelineOptions o;
      o.schedule = schedule;
      o.microBatches = microBatches;
      o.chunks = chunks > 0 ? chunks : (schedule == "interleaved" ? 2 : 1);
      o.split = split == "time" ? pp::SplitMethod::kTime : pp::SplitMethod::kParameters;
      if (!boundaries.empty()) {
        o.split = pp::SplitMethod::kBoundaries;
        o.boundaries = boundaries;
      }
      o.printPlan = false;
      o.checkpointActivations = checkpointActivations;
      pipe = std::make_unique<pp::Pipeline>(
          net, *grid, data[0].first.narrow(0, 0, std::max<int64_t>(1, batch / microBatches)),
          crossEntropy, o);
      if (world.rank == 0) std::cerr << pipe->plan().table;
    }
    torch::optim::SGD opt(pipe ? pipe->parameters() : net->parameters(),
                          torch::optim::SGDOptions(0.05).momentum(0.9));
    std::chrono::steady_clock::time_point timedStart;
    for (int k = 0; k < warmup + steps; ++k) {
      if (k == warmup) {
        if (pipe) shoal::comm::barrier(*world.group);
        timedStart = std::chrono::steady_clock::now();
      }
      const auto& [x, y] = data[static_cast<size_t>(k) % data.size()];
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      if (pipe) {
        loss = pipe->step(x, y).item<double>();
      } else {
        const int64_t before = heapBytes();
        auto l = crossEntropy(net->forward(x), y);
        peakBytes = std::max(peakBytes, heapBytes() - before);
        l.backward();
        loss = l.item<double>();
      }
      opt.step();
      if (k >= warmup) {
        stepMs.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
        if (pipe) {
          idle.push_back(pipe->lastStats().idleFraction());
          computeMs.push_back(pipe->lastStats().computeSeconds() * 1e3);
          peakInFlight = std::max(peakInFlight, pipe->lastStats().peakInFlight);
          peakBytes = std::max(peakBytes, pipe->lastStats().peakActivationBytes);
        }
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - timedStart).count();
    row["samples_per_second"] = static_cast<double>(batch) * steps / seconds;
    row["step_ms_median"] = median(stepMs);
    row["loss"] = loss;
    if (!pipe) {
      row["variant"] = "plain libtorch";
      row["schedule"] = "none";
      row["peak_activation_bytes"] = {peakBytes};
      std::cout << row.dump() << std::endl;
      return 0;
    }
    // Per-rank figures, gathered on every rank.
    const int n = world.size;
    constexpr size_t kFields = 4;
    std::vector<double> mine{median(idle), static_cast<double>(peakInFlight),
                             static_cast<double>(peakBytes), median(computeMs)};
    std::vector<double> all(mine.size() * static_cast<size_t>(n));
    shoal::comm::allgather(*world.group, mine.data(), all.data(), mine.size(),
                           shoal::DataType::kFloat64);
    std::vector<double> bubble, compute;
    std::vector<int64_t> inFlight, bytes;
    for (int r = 0; r < n; ++r) {
      bubble.push_back(all[r * kFields]);
      inFlight.push_back(static_cast<int64_t>(all[r * kFields + 1]));
      bytes.push_back(static_cast<int64_t>(all[r * kFields + 2]));
      compute.push_back(all[r * kFields + 3]);
    }
    const auto& s = pipe->schedule();
    row["variant"] = "shoal pipeline";
    row["schedule"] = schedule;
    row["stages"] = s.stages;
    row["chunks"] = s.chunks;
    row["micro_batches"] = s.microBatches;
    row["bubble_measured"] = bubble;
    row["bubble_formula"] = static_cast<double>(s.stages - 1) /
                            (static_cast<double>(s.chunks) * s.microBatches + s.stages - 1);
    row["peak_in_flight"] = inFlight;
    row["compute_ms"] = compute;  // per rank: forward + backward per step (median)
    row["checkpoint_activations"] = checkpointActivations;
    row["peak_activation_bytes"] = bytes;
    row["plan_boundaries"] = pipe->plan().boundaries;
    if (!trace.empty()) pp::writeChromeTrace(*world.group, grid->stage, pipe->lastTrace(), trace);
    if (world.rank == 0) std::cout << row.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "pipeline_train: " << e.what() << "\n";
    return 1;
  }
}
