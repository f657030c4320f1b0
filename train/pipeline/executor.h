// Runs one rank's action list (train/pipeline/schedule.h) for one training step: the single
// executor behind every schedule.
//
// Per micro-batch and chunk it keeps the chunk's input (a leaf that requires grad, so backward
// yields the gradient to send back) and its output (or, on the last virtual stage, the scaled
// loss) from Forward until Backward, then drops them: what a schedule holds in flight is what
// memory holds. The loss of micro-batch i is scaled by (its samples / the batch's samples), so
// the gradients accumulated over the micro-batches are those of the whole batch's mean loss.
//
// Data parallelism (DP x PP): with a `finalBackward` hook, every Backward but the rank's last
// one runs inside it with gradient synchronization off, and the last one with it on, so the
// reducer's buckets start while that backward still runs (the pipeline's cool-down).
//
// Threading: one training thread; the chunks, transfers and hooks belong to it during run().
// Blocking: run() blocks on receives (bounded by the pipeline group's timeout).
// Errors: an action that fails is rethrown with the same error type (and origin) and a prefix
// naming the virtual stage, this pipeline rank, the action, the micro-batch and the step.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "common/trace.h"
#include "train/pipeline/schedule.h"
#include "train/pipeline/transfer.h"

namespace shoal::train::pipeline {

using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

// One action as it ran, for the timeline: microseconds on the steady clock.
struct TraceEvent {
  Action action;
  int64_t startUs = 0;
  int64_t durationUs = 0;
};

struct StepStats {
  double seconds = 0;  // the whole step on this rank, transfers and waits included
  std::vector<double> chunkComputeSeconds;  // its Forward and Backward actions, per chunk
  int peakInFlight = 0;             // micro-batches between their forward and backward, at most
  int64_t peakActivationBytes = 0;  // heap bytes above the step's start, sampled per action
  // Forward and Backward over all of this rank's chunks.
  double computeSeconds() const {
    return std::accumulate(chunkComputeSeconds.begin(), chunkComputeSeconds.end(), 0.0);
  }
  double idleFraction() const { return seconds > 0 ? 1.0 - computeSeconds() / seconds : 0.0; }
};

struct ExecutorHooks {
  // Runs `forward` of a chunk on `input` (e.g. through activation checkpointing); null: plainly.
  std::function<torch::Tensor(torch::nn::Sequential&, const torch::Tensor&)> forward;
  // With data parallelism: called with true before the rank's last Backward of the step and
  // with false at the step's start (gradient synchronization on / off). Null: no DP.
  std::function<void(bool)> setSync;
  // The job's timeline (common/trace.h): each action of a step as a span, category "pipeline".
  // Null: not tracing.
  std::shared_ptr<TraceSink> trace;
};

class Executor {
 public:
  // `chunks[c]` is this rank's chunk c (virtual stage c * p + rank).
  Executor(const Schedule& schedule, int rank, std::vector<torch::nn::Sequential> chunks,
           Transfers& transfers, LossFn loss, ExecutorHooks hooks);

  // Runs the list for `step`. `inputs` (virtual stage 0's rank) and `targets` (the last's) are
  // the micro-batches, empty elsewhere; `scales[i]` multiplies micro-batch i's loss. Returns the
  // sum of the scaled losses on the last virtual stage's rank (the batch's mean loss), else 0.
  double run(int64_t step, const std::vector<torch::Tensor>& inputs,
             const std::vector<torch::Tensor>& targets, const std::vector<double>& scales);

  // Forward only (evaluation, no graph): every micro-batch through every chunk, in micro-batch
  // order. Returns the last virtual stage's outputs per micro-batch on its rank, else empty.
  std::vector<torch::Tensor> forwardOnly(int64_t step, const std::vector<torch::Tensor>& inputs);

  const StepStats& stats() const { return stats_; }
  // The actions of the last step run() ran (forwardOnly() leaves these and stats() alone), in
  // the order they ran.
  const std::vector<TraceEvent>& trace() const { return trace_; }

 private:
  // Runs `list`, timing each action; what an action throws comes out with its context.
  void runList(const std::vector<Action>& list, int64_t step,
               const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets,
               const std::vector<double>& scales, double& lossSum);
  void runAction(const Action& a, int64_t step, const std::vector<torch::Tensor>& inputs,
                 const std::vector<torch::Tensor>& targets, const std::vector<double>& scales,
                 bool lastBackward, double& lossSum);

  struct Slot {  // one (chunk, micro-batch)
    torch::Tensor input, output, received, gradient;
  };
  bool forwardOnly_ = false;  // in forwardOnly(): keep the last stage's outputs, no loss
  std::vector<torch::Tensor> results_;
  Slot& slot(const Action& a) { return slots_[a.chunk * schedule_.microBatches + a.microBatch]; }

  const Schedule& schedule_;
  int rank_;
  std::vector<torch::nn::Sequential> chunks_;
  Transfers& transfers_;
  LossFn loss_;
  ExecutorHooks hooks_;
  std::vector<Slot> slots_;
  int inFlight_ = 0;
  StepStats stats_;
  std::vector<TraceEvent> trace_;
};

}  // namespace shoal::train::pipeline
