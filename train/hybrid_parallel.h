// Data x pipeline x tensor parallelism for one torch::nn::Sequential on one process grid
// (train/process_grid.h): the model's layers are split over the grid's tensor group (build it
// from train/tensor/'s layers with that group, e.g. train/gpt.h's makeGpt), cut into stages
// over its pipeline group (train/pipeline/pipeline.h, when pipeline > 1), and replicated over
// its data group, whose gradients are averaged (by the pipeline's DDP, or by
// DistributedDataParallel on the data group when there is no pipeline).
//
//   auto grid = makeProcessGrid(world.group, {.pipeline = 2, .tensor = 2});
//   auto net = makeGpt(config, {grid.tensor});
//   HybridParallel model(net, grid, sample, loss, options);
//   torch::optim::AdamW opt(model.parameters(), ...);
//   for (...) { opt.zero_grad(); double loss = model.step(x, y); opt.step(); }
//
// Every rank passes the same global batch; each replica takes its equal share (the batch must
// divide over the data size), so every grid shape computes the same gradient as one process.
//
// Collective: the constructor, step() and gatherFullState() are called by every rank of the
// grid's world, in the same order. Threading: one training thread. Blocking: bounded by the
// groups' timeouts; failures are the groups' (PeerError / TimeoutError naming the failed rank).
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <vector>

#include "train/ddp.h"
#include "train/full_state.h"
#include "train/mixed_precision.h"
#include "train/pipeline/pipeline.h"
#include "train/process_grid.h"
#include "train/sharded_checkpoint.h"

namespace shoal::train {

struct HybridOptions {
  pipeline::PipelineOptions pipeline;  // used when the grid's pipeline size > 1
  DdpOptions ddp;                      // used when data > 1 without a pipeline
  // train/mixed_precision.h: bf16 runs the forward under CPU autocast (the pipeline's plan too,
  // so bf16 activations cross stages); fp16 holds fp16 roundings of the weights through forward
  // and backward and rounds the weight gradients to fp16 (the emulation of Note [What fp16 is
  // on this CPU]), with dynamic loss scaling. Master weights and optimizer state stay fp32.
  Precision precision = Precision::kFloat32;
  LossScalerOptions scaler;  // enabled for fp16 unless set
};

class HybridParallel {
 public:
  // `sampleMicroBatch`: one micro-batch of inputs for the pipeline's plan (see
  // pipeline::Pipeline; unused without pipeline parallelism).
  HybridParallel(torch::nn::Sequential model, const ProcessGrid& grid,
                 const torch::Tensor& sampleMicroBatch, pipeline::LossFn loss,
                 HybridOptions options = {});
  ~HybridParallel();
  HybridParallel(const HybridParallel&) = delete;
  HybridParallel& operator=(const HybridParallel&) = delete;

  // Forward and backward of the global batch (this replica's share); afterwards this rank's
  // parameters hold the gradients of the global batch's mean loss. Returns that loss on every
  // rank. InvalidArgument if the batch does not divide over the replicas.
  double step(const torch::Tensor& inputs, const torch::Tensor& targets);

  // The optimizer step after step(): with loss scaling, unscales the gradients and steps only
  // if no rank of the grid found an inf or nan (agreed over the tensor, pipeline and data
  // groups), then updates the scale; otherwise plain optimizer.step(). Returns whether it
  // stepped. Collective over the grid.
  bool optimizerStep(torch::optim::Optimizer& optimizer);
  const LossScaler& scaler() const { return scaler_; }

  // The global batch's mean loss, forward only (no graph, no gradients), on every rank.
  double evaluate(const torch::Tensor& inputs, const torch::Tensor& targets);
  // This rank's part of evaluating a batch every rank is given: its replica's near-equal share
  // (a replica may get none; a share shorter than the pipeline's micro-batches is padded, the
  // padding's outputs dropped), forward only. {loss x samples, correct, samples} on tensor rank 0
  // of the last stage, zeros elsewhere: summed over the world, the batch's loss and accuracy
  // (correct: argmax over dim 1 equals the target; only with `classes`, whole logits). Collective
  // over this replica's pipeline and tensor groups.
  std::array<double, 3> evaluateShare(const torch::Tensor& inputs, const torch::Tensor& targets,
                                      bool classes);

  // This rank's parameters (its slices of its stage's layers), for its optimizer.
  std::vector<torch::Tensor> parameters() const;
  // The module holding them: the pipeline's stage module, or the whole model without pipeline
  // parallelism (train/grid_grad_norm.h clips over it).
  torch::nn::Module& localModule() { return pipeline_ ? pipeline_->stageModule() : *model_; }

  // The full model's parameters on every rank, named as in the one-process Sequential
  // (gathered over the tensor group, then over the pipeline's stages).
  FullState gatherFullState();

  // Checkpoints of every rank's shard in `dir` (train/sharded_checkpoint.h), for an exact
  // resume on the same pipeline and tensor split (any number of replicas). Not collective.
  std::unique_ptr<ShardedCheckpointer> checkpointer(const std::string& dir, int keep);

  const ProcessGrid& grid() const { return grid_; }
  // Null without pipeline parallelism.
  pipeline::Pipeline* pipeline() { return pipeline_.get(); }

 private:
  torch::Tensor share(const torch::Tensor& batch) const;

  ProcessGrid grid_;
  torch::nn::Sequential model_;
  pipeline::LossFn loss_;
  Precision precision_;
  LossScaler scaler_;
  std::unique_ptr<Fp16Weights> fp16_;
  std::unique_ptr<pipeline::Pipeline> pipeline_;
  std::unique_ptr<DistributedDataParallel> ddp_;
};

}  // namespace shoal::train
