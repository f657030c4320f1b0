// Pipeline parallelism for a torch::nn::Sequential: the model the user already has is cut into
// contiguous stages, one (or, interleaved, several chunks) per rank of a pipeline group, and
// each global batch flows through them as micro-batches under a schedule.
//
//   auto world = shoal::init();
//   auto grid = pipeline::makeGrid(world.group, /*stages=*/2);   // replicas = world / stages
//   pipeline::Pipeline pipe(net, grid, sampleMicroBatch, crossEntropy, {.schedule = "1f1b",
//                                                                        .microBatches = 8});
//   torch::optim::SGD opt(pipe.parameters(), 0.05);
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     torch::Tensor loss = pipe.step(x, y);   // forward + backward of every micro-batch
//     opt.step();                             // each rank steps its own stage
//   }
//
// The plan (which layers each virtual stage gets) is made on world rank 0 and broadcast, so
// every rank runs the same one: by measured time (each layer's forward + backward profiled on
// the sample micro-batch, exact dynamic programming over the cut points), by parameter count,
// or at explicit boundaries. It is printed on world rank 0. Every rank must construct the same
// model (same layers, same seed); each keeps only its chunks' layers (drop the Sequential to
// free the others).
//
// Data parallelism x pipeline (the grid's replicas > 1): each stage's gradients are averaged
// over the replicas of that stage with DistributedDataParallel (train/ddp.h) on the grid's data
// group, overlapped with the last backward of the step.
//
// Collective: the constructor and step() are called by every rank of the grid's world, in the
// same order. Threading: one training thread. Blocking: bounded by the groups' timeouts.
// Errors: a stage that dies or stalls makes step() throw PeerError / TimeoutError on the other
// stages, naming the pipeline rank that failed, and this rank's action and micro-batch; a
// stage whose output does not have the planned shape is a MismatchError naming the stage,
// micro-batch and both shapes (on the sender; its peers see it as the cause). Bad options are
// InvalidArgument before anything runs.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/ddp.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/grid.h"
#include "train/pipeline/plan.h"
#include "train/pipeline/schedule.h"
#include "train/pipeline/split_advice.h"
#include "train/pipeline/transfer.h"

namespace shoal::train::pipeline {

struct PipelineOptions {
  std::string schedule = "1f1b";  // "gpipe", "1f1b", "interleaved"
  int microBatches = 4;
  int chunks = 1;  // per rank; > 1 only with "interleaved" (which needs >= 2)
  SplitMethod split = SplitMethod::kTime;
  // kBoundaries: the first layer of each virtual stage after the first (stages * chunks - 1
  // increasing indices).
  std::vector<int> boundaries;
  int profileRepeats = 3;  // kTime: timed runs per layer (median)
  // Keep only each micro-batch's stage input; recompute the forward during backward.
  bool checkpointActivations = false;
  // step() returns the loss on every rank (one broadcast per step); off: last stage only.
  bool broadcastLoss = true;
  // Print the plan on world rank 0.
  bool printPlan = true;
  DdpOptions ddp;  // with replicas > 1 (findUnusedParameters is forced on, see pipeline.cpp)
  Transfers::Options transfers;
};

class Pipeline {
 public:
  // Collective over grid.world. `sampleMicroBatch` (one micro-batch of inputs; used on world
  // rank 0 only, may be undefined elsewhere) is what the plan profiles and traces shapes with.
  // With tensor parallelism (grid.tensor of size > 1) the model's layers are collective over the
  // tensor group, so world rank 0's tensor-parallel peers (replica 0, stage 0) run the planning
  // with it and need the same sample.
  Pipeline(torch::nn::Sequential model, const Grid& grid, const torch::Tensor& sampleMicroBatch,
           LossFn loss, PipelineOptions options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Forward and backward of every micro-batch of the batch under the schedule; afterwards this
  // rank's parameters hold the gradients of the batch's mean loss (averaged over replicas with
  // DP). `inputs` are used on the first stage, `targets` on the last (others may pass
  // undefined tensors); the batch is split into microBatches near-equal parts along dim 0.
  // Returns the batch's mean loss (every rank with broadcastLoss, else the last stage only;
  // undefined elsewhere).
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& targets);

  // This rank's parameters (its chunks), for its optimizer.
  std::vector<torch::Tensor> parameters() const { return stage_->parameters(); }

  // Forward only, without a graph (evaluation): returns the model's outputs for `inputs` on the
  // last stage's rank (undefined elsewhere). Collective over the pipeline group.
  torch::Tensor predict(const torch::Tensor& inputs);
  // This rank's chunks as one module ("chunk0", "chunk1", ...): for checkpoints.
  torch::nn::Module& stageModule() { return *stage_; }
  const Plan& plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  const Grid& grid() const { return grid_; }
  bool hasFirstStage() const { return grid_.stage == 0; }
  bool hasLastStage() const { return grid_.stage == grid_.stages - 1; }

  // The last step's statistics and per-action timeline on this rank. Its seconds run from the
  // step's start to the end of its last synchronization (the loss broadcast with
  // broadcastLoss): the same span on every rank, so idleFraction() is the bubble of the step.
  const StepStats& lastStats() const { return stats_; }

  // Each (virtual) stage's compute time per step, measured over every step() so far, and a
  // better split if the times call for one (train/pipeline/split_advice.h; interleaved: over
  // the virtual stages, judged by each rank's sum of its chunks). Collective over the pipeline
  // group (one all-gather); blocking, bounded by its timeout. InvalidArgument before the first
  // step.
  SplitAdvice splitAdvice();
  const std::vector<TraceEvent>& lastTrace() const { return executor_->trace(); }

 private:
  Grid grid_;
  PipelineOptions options_;
  Schedule schedule_;
  Plan plan_;
  std::shared_ptr<torch::nn::Module> stage_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Transfers> transfers_;
  std::unique_ptr<Executor> executor_;
  std::optional<DistributedDataParallel::NoSyncGuard> noSync_;
  int64_t step_ = 0;
  StepStats stats_;
  std::vector<double> chunkComputeSeconds_;  // per chunk, summed over the steps measured
  int64_t stepsMeasured_ = 0;
};

}  // namespace shoal::train::pipeline
