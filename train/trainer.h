// One training loop, any strategy: the model code stays the same and the strategy is one option
// (a flag or a config value).
//
//   train::TrainerOptions o;
//   o.strategy = train::parseStrategy(flags.strategy);  // ddp zero1-3 ps pipeline tensor hybrid
//   o.pipelineStages = 2;                                // pipeline, hybrid
//   o.optimizer = {OptimizerKind::kAdam, 1e-3};
//   o.epochs = 3;
//   train::Trainer trainer(ctx, [&](const train::ProcessGrid& grid) { return makeModel(grid); },
//                          train::crossEntropy, o);
//   trainer.fit(trainSet, &testSet);                    // each epoch's metrics
//
// What the loop does for every strategy: the data is dealt out by DistributedSampler (same
// count per rank, reshuffled per epoch by seed); `accumulate` micro-batches per optimizer step
// (the first accumulate-1 backward passes only accumulate locally); gradients clipped to a
// global L2 norm; bf16 autocast for forward and loss; a learning-rate schedule (warm-up, cosine
// decay); checkpoints every N steps and at each epoch's end, and resume from the newest; the
// mean training loss over every rank per epoch; validation loss and accuracy over every rank;
// callbacks after each step and epoch. The strategies (train/trainer/strategy.h):
//
//   ddp      DistributedDataParallel (train/ddp.h); checkpoints sharded, reloadable at any size
//   zero1-3  ZeroDataParallel stages 1-3 (train/zero/zero.h); zero3 needs the Sequential
//            constructor (its units are the Sequential's children)
//   ps       parameter servers (train/ps_trainer.h): the servers hold the parameters and the
//            optimizer and checkpoint themselves; ctx says which ranks are servers (their
//            program calls ps::serve, see examples/trainer_mnist.cpp); ps.mode sync/async/ssp
//   pipeline the Sequential cut into pipelineStages stages (train/pipeline/pipeline.h), its
//            micro-batches under options.pipeline's schedule, replicated over the rest
//   tensor   the model's tensor-parallel layers (train/tensor/) split over tensorParallel ranks
//   hybrid   both at once, on one grid of data x pipeline x tensor (train/hybrid_parallel.h)
//
// The grid strategies (pipeline, tensor, hybrid) take the model built for the grid (the
// ModelBuilder constructor; the Sequential one serves pipeline alone): tensor-parallel layers
// take grid.tensor, which is of size 1 under the other strategies, where they compute as the
// one-process layers do, so one model function serves every strategy. Under them the data is
// global batches of batch x (data replicas) samples, every worker given the same and each
// replica taking its share (a last incomplete batch is left out); micro-batches are the
// pipeline's (accumulate must be 1); fp16 is allowed (dynamic loss scaling, not with clipping);
// checkpoints are one shard per stage and slice, resumable on the same grid; validation accuracy
// needs the last stage's full logits.
//
// The wrappers used here stay public for users who want the loop in their own hands.
//
// Collective: the constructor, fit(), validate() are called by every worker rank in the same
// order. Blocking; each communication bounded by the group's timeout. Errors: InvalidArgument
// for bad options (named); a failed collective (TimeoutError, PeerError naming the failed rank,
// ...) reaches the caller unchanged. Threading: one training thread per rank. The module must
// outlive the Trainer.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/group.h"
#include "ps/client.h"
#include "ps/config.h"
#include "train/checkpoint.h"
#include "train/mixed_precision.h"
#include "train/optim.h"
#include "train/pipeline/pipeline.h"
#include "train/process_grid.h"

namespace shoal::train {

enum class Strategy : uint8_t {
  kDdp,
  kZero1,
  kZero2,
  kZero3,
  kParameterServer,
  kPipeline,
  kTensor,
  kHybrid
};

// "ddp", "zero1", "zero2", "zero3", "ps", "pipeline", "tensor", "hybrid" (InvalidArgument
// listing them otherwise).
Strategy parseStrategy(std::string_view name);
std::string_view toString(Strategy s);

// Which ranks of the world train and which serve parameters (Strategy::kParameterServer: the
// last numServers ranks, as shoal run --servers starts them).
struct TrainerContext {
  std::shared_ptr<comm::Group> world;
  int numServers = 0;
  int psReplicas = 1;  // shoal run --ps-replicas
};

struct TrainerOptions {
  Strategy strategy = Strategy::kDdp;
  OptimizerOptions optimizer;
  int64_t epochs = 1;
  // Samples per rank per micro-batch; under the grid strategies, per data replica per step.
  int64_t batch = 64;
  int64_t accumulate = 1;                     // micro-batches per optimizer step
  double clipNorm = 0;                        // > 0: clip the gradients' global L2 norm to this
  Precision precision = Precision::kFloat32;  // kFloat32 or kBFloat16 (autocast); kFloat16: grid
  uint64_t seed = 0;                          // data order and per-rank dropout streams
  // Learning rate: linear warm-up over warmupSteps, then cosine decay to zero at the last step
  // when cosineDecay (ps: the servers apply the same schedule).
  int64_t warmupSteps = 0;
  bool cosineDecay = false;
  // Checkpoints (not ps: its servers write their own): every checkpointEvery optimizer steps
  // (0: only at each epoch's end) into checkpointDir, the newest `keep` kept; resume loads the
  // newest there and continues from its step.
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keep = 2;
  bool resume = false;
  size_t bucketBytes = 25u << 20;  // ddp and zero1-2 gradient buckets
  // Strategy::kParameterServer: the consistency (sync, async, ssp with staleness) and the
  // client's compression.
  ps::Mode psMode = ps::Mode::kSync;
  int staleness = 2;
  ps::ClientOptions psClient;
  // The grid strategies: stages (pipeline: >= 2, tensor: 1) and tensor-parallel ranks (tensor:
  // >= 2, pipeline: 1); the workers left over are data replicas. `pipeline` is the schedule,
  // micro-batches (which must not exceed batch), split and activation checkpointing.
  int pipelineStages = 1;
  int tensorParallel = 1;
  pipeline::PipelineOptions pipeline;
};

// Loss of a batch: the mean over its samples (libtorch's reduction).
using ForwardFn = std::function<torch::Tensor(const torch::Tensor& input)>;
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
torch::Tensor crossEntropy(const torch::Tensor& logits, const torch::Tensor& target);

// Inputs [n, ...] and targets [n, ...] held in memory (train/idx_dataset.h gives these).
struct TensorDataset {
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t size() const { return inputs.size(0); }
};

struct EpochMetrics {
  int64_t epoch = 0;               // 0-based
  int64_t step = 0;                // optimizer steps after it
  double trainLoss = 0;            // mean over every rank's micro-batches
  double validationLoss = -1;      // -1 without validation data
  double validationAccuracy = -1;  // argmax == target, when targets are class indices
  double seconds = 0;
};

struct StepInfo {
  int64_t epoch = 0;
  int64_t step = 0;  // optimizer steps done, this one included
  double loss = 0;   // this rank's mean over the step's micro-batches
  double lr = 0;
};

// Called on every worker rank, on the training thread. onStep must not communicate on the
// trainer's groups (the ranks are mid-step); onEpoch runs at the same point on every worker
// (after the epoch's sums and checkpoint), so it may run a collective that every worker runs
// there, such as re-measuring the timeline's clocks (run/trace_session.h, resync).
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void onStep(const StepInfo&) {}
  virtual void onEpoch(const EpochMetrics&) {}
};

class DistributionStrategy;  // train/trainer/distribution_strategy.h

// Builds the model for the grid the Trainer made (sizes 1 but for the grid strategies'
// dimensions). Called once on every worker rank, with libtorch's seed set to options.seed so that
// every rank builds the same initial weights.
using ModelBuilder = std::function<torch::nn::Sequential(const ProcessGrid& grid)>;

class Trainer {
 public:
  // ddp, zero1, zero2, ps: any module, run by `forward`.
  Trainer(const TrainerContext& ctx, std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
          LossFn loss, TrainerOptions options);
  // Every strategy, zero3 included (its units are the Sequential's children).
  Trainer(const TrainerContext& ctx, torch::nn::Sequential module, LossFn loss,
          TrainerOptions options);
  // Every strategy: the model built for the Trainer's grid (collective: the grid's splits).
  Trainer(const TrainerContext& ctx, const ModelBuilder& build, LossFn loss,
          TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void addCallback(std::shared_ptr<Callback> callback);

  // Trains options.epochs epochs (from the checkpoint's progress when resuming), validating
  // after each when `validation` is given. Returns each epoch's metrics (those run now).
  std::vector<EpochMetrics> fit(const TensorDataset& train, const TensorDataset* validation);

  // Mean loss and accuracy over `data`, each worker scoring its strided share.
  EpochMetrics validate(const TensorDataset& data);

  // The workers' group (the world without parameter servers), and this rank in it.
  comm::Group& workers() { return *workers_; }
  // The workers' grid: made for the grid strategies and the ModelBuilder constructor (null
  // otherwise).
  const ProcessGrid* grid() const { return grid_ ? &*grid_ : nullptr; }
  const Progress& progress() const { return at_; }

 private:
  void init(const TrainerContext& ctx);
  // Made on first use (fit() knows the total steps, which the ps schedule needs; a pipeline
  // plans with a micro-batch of `sample`).
  void ensureStrategy(int64_t totalSteps, const torch::Tensor& sample);
  torch::Tensor forward(const torch::Tensor& input);
  double learningRate(int64_t step) const;

  std::shared_ptr<torch::nn::Module> module_;
  std::optional<torch::nn::Sequential> sequential_;
  ForwardFn forward_;
  LossFn loss_;
  TrainerOptions options_;
  TrainerContext ctx_;
  std::shared_ptr<comm::Group> workers_;
  std::optional<ProcessGrid> grid_;
  std::unique_ptr<DistributionStrategy> strategy_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  Progress at_;
  int64_t totalSteps_ = 0;  // known once fit() sees the data
};

}  // namespace shoal::train
