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
// decay); an optional cap on the steps of an epoch; checkpoints every N steps and at each epoch's
// end, and resume from the newest; the mean training loss over every rank per epoch; validation
// loss, perplexity and accuracy over every rank, after each epoch and optionally every N steps;
// callbacks after each step, validation and epoch. At the end the full model can be gathered
// (gatherFullState) to be saved or run by one process. The strategies
// (train/trainer/distribution_strategy.h):
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
// one-process layers do, so one model function serves every strategy; a loss that is itself
// split (vocabulary-parallel cross-entropy) takes the grid too (GridLossFn). Hybrid on a grid
// of one process is the one-process model, so one program runs alone or on any grid, with the
// same losses up to rounding (without dropout: its masks follow the split). Under them the data
// is global batches of batch x (data replicas) samples, every worker given the same and each
// replica taking its share (a last incomplete batch is left out); micro-batches are the
// pipeline's (accumulate must be 1); fp16 is allowed (dynamic loss scaling, not with clipping);
// checkpoints are one shard per stage and slice, resumable on the same grid; validation accuracy
// needs the last stage's full logits.
//
// Elastic jobs (`shoal run --elastic MIN:MAX`; TrainerContext::elastic from World::elastic):
// under ddp, zero1 and zero2, fit() goes on when workers die or stall, and admits new ones at a
// step boundary, without a restart (train/elastic.h, whose in-memory commit ends every step;
// ZeRO's shards are kept by train/zero/zero_elastic.h). What changes:
// - The data is dealt by train/elastic_sampler.h from a position in the epoch's permutation, so
//   a view of any size goes on where the last stopped, no sample skipped or taken twice. A step
//   gives each rank up to batch x accumulate samples in micro-batches of `batch`; each
//   micro-batch's loss is weighted by its share of the step's samples, so the update is the
//   exact mean over the step's samples however the last step of an epoch spreads them.
//   stepsPerEpoch caps an epoch at stepsPerEpoch x batch x accumulate x (the launch's workers)
//   samples.
// - The rate's schedule (warm-up, cosine decay) follows the samples trained, counted in steps of
//   scheduleWorkers workers (the launch's by default): with no change it is the step count,
//   after one it stays on course. linearScaling multiplies by the current view's size
//   (referenceBatch is refused).
// - Validation, the epoch's sums and its callbacks run before the step's commit: a failure in
//   them repeats that step from its commit. A step, and so its callbacks, may run again after a
//   view change. The epoch's trainLoss and samples are those of the ranks that end the epoch
//   (a rank that died took its sums); trainLoss is a mean over samples. batchInEpoch and
//   batchesInEpoch count micro-batches of a launch-sized job (the epoch's fraction done).
// - Checkpoints, every checkpointEvery steps and at each epoch's end (the newest `keep` kept),
//   resumable at any size: ddp, one file, the committed state (ElasticState::save), written by
//   the view's rank 0 as checkpointDir/elastic-<step>.state, and as elastic-stopped.state by
//   every survivor when the job stays below its minimum too long (resume loads the newest of
//   them); zero1-2, sharded checkpoints in checkpointDir/elastic-shards (their progress's
//   batchInEpoch holds the position), loaded at the first view's start, none when giving up.
// - Callback::onViewChange tells each rank of a new view; workers() is the current view's group.
// - Nothing may communicate on the world before fit(): a worker that joins builds its Trainer
//   while the running ones are inside the view change that admits it, whose collectives must
//   come first. The Trainer's constructor does not (the ModelBuilder's grid is made without
//   splits); a program's own checks on the world group must be left to the launch's workers
//   (World::elastic's view generation 0).
// Not elastic (InvalidArgument): zero3, ps and the grid strategies, autotune, referenceBatch.
//
// The wrappers used here stay public for users who want the loop in their own hands.
//
// Collective: the constructor, fit(), validate() and gatherFullState() are called by every
// worker rank in the same order. Blocking; each communication bounded by the group's timeout.
// Errors: InvalidArgument for bad options (named); a failed collective (TimeoutError, PeerError
// naming the failed rank,
// ...) reaches the caller unchanged. Threading: one training thread per rank. The module must
// outlive the Trainer.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/compress/spec.h"
#include "comm/group.h"
#include "comm/membership.h"
#include "comm/straggler_monitor.h"
#include "ps/client.h"
#include "ps/config.h"
#include "train/checkpoint.h"
#include "train/full_state.h"
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
  // An elastic job's context (World::elastic): fit() trains elastically (above), starting from
  // `world`, the first view's group. Unset: the world is fixed.
  std::optional<comm::ElasticContext> elastic;
};

struct TrainerOptions {
  Strategy strategy = Strategy::kDdp;
  OptimizerOptions optimizer;
  int64_t epochs = 1;
  // > 0: an epoch ends after at most this many optimizer steps (the first ones of its shuffled
  // order; the next epoch reshuffles), for short runs and smoke tests. 0: every batch.
  int64_t stepsPerEpoch = 0;
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
  // Linear scaling (large batches): the rate x the number of workers, or, with referenceBatch
  // > 0, x (global batch / referenceBatch), which must divide it; reached over warmupSteps from
  // the unscaled rate. ps: the servers scale by the workers (referenceBatch is refused).
  bool linearScaling = false;
  int64_t referenceBatch = 0;
  // Elastic jobs: the schedule counts steps of a job of this many workers (0: the launch's). A
  // job resumed at another size keeps its schedule when given the first launch's size.
  int scheduleWorkers = 0;
  // With validation data, fit() also validates every validateEvery optimizer steps (counted over
  // the whole run, resumed ones included), besides each epoch's end (0: only there).
  int64_t validateEvery = 0;
  // Checkpoints: every checkpointEvery optimizer steps (0: only at each epoch's end) into
  // checkpointDir, the newest `keep` kept; resume loads the newest there and continues from its
  // step. ps: its servers write their own (pass them the same values); the workers save their
  // compression residuals there (ClientOptions::checkpointDir in ps/client.h).
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keep = 2;
  bool resume = false;
  size_t bucketBytes = 25u << 20;  // ddp and zero1-2 gradient buckets
  // Gradient compression of the all-reduce (ddp and zero1: their communication hook,
  // train/ddp/compression_hook.h: fp16, bf16, topk, powersgd, onebit, with an optional
  // uncompressed warm-up). zero2-3 reduce-scatter and the grid strategies take none
  // (InvalidArgument); ps compresses with psClient.compression.
  compress::CompressionSpec compression;
  bool overlap = true;  // ddp: buckets all-reduce while backward still runs
  // ddp: the bucket size (1, 4 or 25 MiB) and overlap (on, off) chosen by successive halving
  // over the first steps (comm/autotuner.h: every rank agrees; collective at each trial's end),
  // training all along (every choice computes the same average); the choice reaches the
  // callbacks (StepInfo::autotuned). Replaces bucketBytes and overlap. Other strategies:
  // InvalidArgument.
  bool autotune = false;
  // > 0: every stragglerWindow optimizer steps the workers compare their mean compute and data
  // time per step (comm/straggler_monitor.h: one all-gather of two numbers; a rank above
  // stragglerThreshold times the median rank in two windows in a row is named in a warning by
  // rank 0) and the callbacks get the report (StepInfo::stragglers). Compute is the step's
  // computeSeconds less its data (StepInfo); a phase under 1 ms per step on the median rank is
  // not judged. 0: off.
  int stragglerWindow = 0;
  // A finite number above 1 (InvalidArgument otherwise): how many times the median rank's
  // time a rank's must be to count as slow in a window.
  double stragglerThreshold = 1.3;
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
  // The grid's layout (ProcessGridOptions::order, train/process_grid.h): dimensions
  // fastest-varying first.
  std::string gridOrder = "tensor,pipeline,data";
};

// Loss of a batch: the mean over its samples (libtorch's reduction).
using ForwardFn = std::function<torch::Tensor(const torch::Tensor& input)>;
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
torch::Tensor crossEntropy(const torch::Tensor& logits, const torch::Tensor& target);
// A loss that needs the grid the model was split on (e.g. train/gpt.h's gptLoss, which is
// collective over grid.tensor).
using GridLossFn = std::function<torch::Tensor(
    const torch::Tensor& output, const torch::Tensor& target, const ProcessGrid& grid)>;

// Inputs [n, ...] and targets [n, ...] held in memory (train/idx_dataset.h gives these).
struct TensorDataset {
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t size() const { return inputs.size(0); }
};

// After an epoch (Callback::onEpoch) or a validation (onValidation).
struct EpochMetrics {
  int64_t epoch = 0;  // 0-based
  int64_t step = 0;   // optimizer steps after it
  // Mean over every rank's micro-batches: of the epoch (onEpoch), or since the previous
  // validation or the start of fit() (onValidation).
  double trainLoss = 0;
  double validationLoss = -1;        // -1 without validation data
  double validationPerplexity = -1;  // exp(validationLoss): per token for a language model
  double validationAccuracy = -1;    // argmax == target, when targets are class indices
  int64_t samples = 0;               // trained on by the job in the epoch (onEpoch)
  // Of `seconds`, the time worker 0 spent in the epoch's steps (no validation or checkpoints
  // between them): samples / trainSeconds is the job's training throughput (onEpoch).
  double trainSeconds = 0;
  // Wall time of the epoch (onEpoch), or since the previous validation or the start of fit()
  // (onValidation); validation included.
  double seconds = 0;
};

struct StepInfo {
  int64_t epoch = 0;
  int64_t step = 0;  // optimizer steps done, this one included
  double loss = 0;   // this rank's mean over the step's micro-batches
  double lr = 0;
  int64_t batchInEpoch = 0;    // micro-batches of the epoch done, this step's included
  int64_t batchesInEpoch = 0;  // micro-batches in the epoch
  int64_t samples = 0;         // this rank's samples in the step
  // The whole job's samples in the step: every data replica's (ddp, zero, ps: each worker
  // trains its own share; the grid strategies: the global batch, which every worker takes).
  int64_t jobSamples = 0;
  // This rank's wall time of the step (data, compute, communication), of which taking the
  // batches from the dataset, and of which waiting for the communication at its end (ddp: the
  // last buckets; 0 for the other strategies).
  double seconds = 0;
  double dataSeconds = 0;
  double commWaitSeconds = 0;
  // Note [Step-time breakdown]: `seconds` in three parts that add up to it. waitingSeconds and
  // communicationSeconds are the time the training thread was blocked on communication (an
  // operation it ran, or ddp's wait for its buckets at the end of backward), split where each
  // operation first heard from a peer (comm/operation_times.h): before, it waited for slower
  // peers (a lower bound: a late peer met only after the first message shows as moving);
  // after, it moved and reduced data that no computation hid (and a blocked operation in which
  // no message arrived counts here whole). computeSeconds is the rest: data loading, forward,
  // backward, the optimizer, and any communication overlapped with them. Seen: the operations
  // of the native engine on the Trainer's groups that run in issue order; waits on
  // asynchronous work that no strategy reports (ZeRO's prefetches, the pipeline's transfers,
  // the parameter-server client, MPI) count as compute.
  double computeSeconds = 0;
  double communicationSeconds = 0;
  double waitingSeconds = 0;
  // The straggler report on the steps that end a window (stragglerWindow > 0); null otherwise.
  // Valid during the call.
  const comm::StragglerReport* stragglers = nullptr;
  // autotune: the choice and every candidate's time (comm::Autotuner::describe()) on the step
  // that made it, with its index into the candidates; empty and -1 otherwise.
  std::string autotuned;
  int autotuneChoice = -1;
};

// What a strategy sent since fit() began: ddp, this rank's bytes on the workers' group (checks
// and buffers included; 0 on MPI); ps, the gradient payload pushed. Others: zero.
struct CommunicationTotals {
  uint64_t bytesSent = 0;
  int64_t steps = 0;  // synchronized steps they cover
};

// An elastic job's new view (Callback::onViewChange): the workers before and now, this rank in
// the new view, and what ElasticState measured (train/elastic.h's ElasticStats).
struct ViewChange {
  int64_t generation = 0;
  int oldSize = 0;
  int newSize = 0;
  int rank = 0;
  int64_t resumedStep = 0;  // the committed step every rank of the view continues from
  double recoverySeconds = 0;
};

// Called on every worker rank, on the training thread. onStep must not communicate on the
// trainer's groups (the ranks are mid-step); onValidation and onEpoch run at the same point on
// every worker (after the sums), so they may run a collective that every worker runs there, such
// as re-measuring the timeline's clocks (run/trace_session.h, resync). onValidation follows each
// validation fit() runs: every validateEvery steps and at each epoch's end (once when both fall
// on one step, before that epoch's onEpoch).
class Callback {
 public:
  virtual ~Callback() = default;
  // Once per fit(), before its first step, with the progress it starts from (a resumed run's
  // checkpoint, or the parameter servers' step; epoch 0, step 0 otherwise).
  virtual void onFitStart(const Progress&) {}
  virtual void onStep(const StepInfo&) {}
  virtual void onValidation(const EpochMetrics&) {}
  virtual void onEpoch(const EpochMetrics&) {}
  // Elastic jobs: after a view change, before the view's first step (every rank of the new view
  // but joiners, which were in none before).
  virtual void onViewChange(const ViewChange&) {}
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
  // The same with a loss given that grid on every call.
  Trainer(const TrainerContext& ctx, const ModelBuilder& build, GridLossFn loss,
          TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void addCallback(std::shared_ptr<Callback> callback);

  // Trains options.epochs epochs (from the checkpoint's progress when resuming), validating
  // after each (and every validateEvery steps) when `validation` is given. Returns each epoch's
  // metrics (those run now).
  std::vector<EpochMetrics> fit(const TensorDataset& train, const TensorDataset* validation);

  // Mean loss, perplexity and accuracy over `data`, each worker scoring its strided share.
  EpochMetrics validate(const TensorDataset& data);

  // The full model's parameters on every worker, named as in the one-process model
  // (train/full_state.h: writeFullState saves them, loadFullState loads them into the model
  // built for a grid of one). Collective over the workers. Grid strategies: gathered over slices
  // and stages (after fit(); InvalidArgument before); ddp, zero1, zero2: the replica's own
  // (whole on every rank). zero3 and ps hold no whole replica on a worker: InvalidArgument
  // (zero3 checkpoints consolidate into one file: train/reshard_checkpoint.h).
  FullState gatherFullState();

  // The workers' group (the world without parameter servers; an elastic job's current view),
  // and this rank in it.
  comm::Group& workers() { return *workers_; }
  // The workers' grid: made for the grid strategies and the ModelBuilder constructor (null
  // otherwise).
  const ProcessGrid* grid() const { return grid_ ? &*grid_ : nullptr; }
  const Progress& progress() const { return at_; }
  // What the strategy sent so far (zero before fit()).
  CommunicationTotals communication() const;
  // The pipeline of the grid strategies with pipelineStages > 1, once fit() made it (null
  // otherwise): its plan, its last step's timeline (lastTrace(), for
  // train/pipeline/trace.h's writeChromeTrace) and statistics. Valid while the Trainer lives.
  pipeline::Pipeline* pipeline();
  // The grid strategies' loss scaler, once fit() made it (enabled under fp16: its skipped steps
  // and scale); null otherwise.
  const LossScaler* lossScaler() const;

 private:
  void init(const TrainerContext& ctx);
  void build(const ModelBuilder& build);
  // fit() of an elastic job (train/trainer/elastic_fit.cpp).
  std::vector<EpochMetrics> fitElastic(const TensorDataset& train, const TensorDataset* validation);
  // The strategies that leave the forward to the loop: one micro-batch's forward and backward of
  // its loss / `divisor` (sync false: accumulated locally). Returns the loss (the batch's mean).
  double forwardBackward(const torch::Tensor& x, const torch::Tensor& y, double divisor, bool sync);
  // The optimizer step that ends step at_.step at rate lr, then its record (info's step, lr,
  // times; the autotuner's and straggler monitor's turn) and the callbacks' onStep.
  void endStep(StepInfo& info, double lr, std::chrono::steady_clock::time_point started,
               double waitedBefore);
  // An elastic view's group: the workers' group, the strategy's, the straggler monitor's and
  // the step-time records' (enterView); the strategy and the monitor let go of it when the view
  // ends (leaveView).
  void enterView(const std::shared_ptr<comm::Group>& group);
  void leaveView();
  // Validation inside fit(): the training loss since the previous one (`since`: sum, count;
  // reset), then the callbacks.
  EpochMetrics validateAndReport(const TensorDataset& data, double since[2]);
  // The validations a fit() ran: the last one's metrics and its step.
  struct Validations {
    EpochMetrics last;
    int64_t step = -1;
  };
  // After a step: validates (validateAndReport) when validation data is given and the step is
  // a multiple of validateEvery.
  void validateIfDue(const TensorDataset* validation, double since[2], Validations& done);
  // At an epoch's end, with validation data: m takes the last validation's numbers, validating
  // first unless the epoch's last step has just done so.
  void addEpochValidation(EpochMetrics& m, const TensorDataset* validation, double since[2],
                          Validations& done);
  // Made on first use (fit() knows the total steps, which the ps schedule needs; a pipeline
  // plans with a micro-batch of `sample`).
  void ensureStrategy(int64_t totalSteps, const torch::Tensor& sample);
  torch::Tensor forward(const torch::Tensor& input);
  double learningRate(int64_t step) const;
  // The step's times, the autotuner's and the straggler monitor's turn (collective at the ends
  // of their trials and windows).
  void finishStep(StepInfo& info, std::chrono::steady_clock::time_point started,
                  double waitedBefore);
  // Note [Step-time breakdown]: fills the step's three parts.
  void splitStepTime(StepInfo& info, comm::TimeSpan step);
  // stragglerWindow > 0: a straggler monitor over workers_.
  void watchStragglers();
  // Records the operations of `group`'s engine into operationTimes_ (once per group).
  void timeOperations(const std::shared_ptr<comm::Group>& group);

  std::shared_ptr<torch::nn::Module> module_;
  std::optional<torch::nn::Sequential> sequential_;
  ForwardFn forward_;
  LossFn loss_;
  TrainerOptions options_;
  TrainerContext ctx_;
  std::shared_ptr<comm::Group> workers_;
  std::optional<ProcessGrid> grid_;
  std::unique_ptr<DistributionStrategy> strategy_;
  std::optional<comm::StragglerMonitor> stragglers_;  // stragglerWindow > 0
  // The step-time breakdown's records, from the engines of timedGroups_ (detached by the
  // destructor: a group may outlive the Trainer).
  std::shared_ptr<comm::OperationTimeLog> operationTimes_;
  std::vector<std::shared_ptr<comm::Group>> timedGroups_;
  std::optional<comm::StragglerReport> lastStragglers_;
  int lrScale_ = 1;  // linearScaling's factor
  std::vector<std::shared_ptr<Callback>> callbacks_;
  Progress at_;
  int64_t totalSteps_ = 0;                            // known once fit() sees the data
  std::chrono::steady_clock::time_point lastReport_;  // the previous validation or fit()'s start
};

}  // namespace shoal::train
