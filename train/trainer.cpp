#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/trace.h"
#include "train/distributed_sampler.h"
#include "train/hybrid_parallel.h"
#include "train/trainer/distribution_strategy.h"
#include "train/trainer/loop_common.h"
#include "train/trainer/trainer_options.h"

namespace shoal::train {

using loop::mixSeed;
using loop::require;
using loop::secondsSince;
using loop::sumOverWorkers;

torch::Tensor DistributionStrategy::forward(const torch::Tensor&) {
  SHOAL_THROW(InvalidArgument, "this strategy does not run the forward itself");
}

double DistributionStrategy::trainStep(const torch::Tensor&, const torch::Tensor&) {
  SHOAL_THROW(InvalidArgument, "this strategy does not run whole steps itself");
}

std::array<double, 3> DistributionStrategy::evaluate(const torch::Tensor&, const torch::Tensor&,
                                                     bool) {
  SHOAL_THROW(InvalidArgument, "this strategy does not run its validation itself");
}

std::unique_ptr<ElasticState> DistributionStrategy::makeElastic(const comm::ElasticContext&,
                                                                std::shared_ptr<comm::Group>,
                                                                ElasticOptions) {
  SHOAL_THROW(InvalidArgument, "this strategy is not elastic");
}

void DistributionStrategy::enterView(std::shared_ptr<comm::Group>) {
  SHOAL_THROW(InvalidArgument, "this strategy is not elastic");
}

torch::Tensor crossEntropy(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

Trainer::Trainer(const TrainerContext& ctx, std::shared_ptr<torch::nn::Module> module,
                 ForwardFn forward, LossFn loss, TrainerOptions options)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      loss_(std::move(loss)),
      options_(std::move(options)) {
  require(module_ && forward_ && loss_, "Trainer: module, forward and loss must all be given");
  require(options_.strategy != Strategy::kZero3 && !onGrid(options_.strategy),
          "strategy {} needs the model as a torch::nn::Sequential (the Trainer's Sequential "
          "or ModelBuilder constructor)",
          toString(options_.strategy));
  init(ctx);
}

Trainer::Trainer(const TrainerContext& ctx, torch::nn::Sequential module, LossFn loss,
                 TrainerOptions options)
    : module_(module.ptr()),
      sequential_(module),
      loss_(std::move(loss)),
      options_(std::move(options)) {
  require(static_cast<bool>(loss_), "Trainer: the loss must be given");
  forward_ = [seq = *sequential_](const torch::Tensor& x) mutable { return seq->forward(x); };
  require(options_.tensorParallel == 1,
          "strategy {} with tensorParallel {}: the model's layers must be built on the "
          "Trainer's grid (the ModelBuilder constructor)",
          toString(options_.strategy), options_.tensorParallel);
  init(ctx);
}

Trainer::Trainer(const TrainerContext& ctx, const ModelBuilder& build, LossFn loss,
                 TrainerOptions options)
    : loss_(std::move(loss)), options_(std::move(options)) {
  require(build && loss_, "Trainer: the model builder and the loss must be given");
  init(ctx);
  this->build(build);
}

Trainer::Trainer(const TrainerContext& ctx, const ModelBuilder& build, GridLossFn loss,
                 TrainerOptions options)
    : options_(std::move(options)) {
  require(build && loss, "Trainer: the model builder and the loss must be given");
  init(ctx);
  // The grid lives in this Trainer, which can be neither copied nor moved.
  loss_ = [loss = std::move(loss), grid = &*grid_](
              const torch::Tensor& out, const torch::Tensor& y) { return loss(out, y, *grid); };
  this->build(build);
}

void Trainer::build(const ModelBuilder& build) {
  torch::manual_seed(options_.seed);  // the same initial weights on every rank
  sequential_ = build(*grid_);
  require(!sequential_->is_empty(), "Trainer: the model builder returned an empty model");
  module_ = sequential_->ptr();
  forward_ = [seq = *sequential_](const torch::Tensor& x) mutable { return seq->forward(x); };
}

Trainer::~Trainer() {
  for (const auto& g : timedGroups_) g->engine().logOperationTimes(nullptr);
}

void Trainer::init(const TrainerContext& ctx) {
  validateOptions(options_);
  require(ctx.world != nullptr, "Trainer: the context has no world group");
  ctx_ = ctx;
  validateContext(options_, ctx);
  const int numWorkers = ctx.world->size() - ctx.numServers;
  // The workers' own group (losses, validation): the world includes the servers.
  workers_ = ctx.numServers > 0
                 ? ctx.world->connect("trainer-workers", ctx.world->rank(), numWorkers)
                 : ctx.world;
  if (ctx.elastic && !module_) {
    // Nothing here may communicate in an elastic job: a joiner builds its Trainer while the
    // running workers are inside the view change that admits it, whose collectives come first.
    // Its strategies split nothing, so the model function gets a grid of data replicas alone,
    // made without the splits (no tensor or pipeline groups: both have one rank).
    grid_.emplace();
    grid_->world = workers_;
    grid_->dataSize = workers_->size();
    grid_->dataRank = workers_->rank();
    grid_->order = "tensor,pipeline,data";
  } else if (onGrid(options_.strategy) || !module_) {
    grid_ = makeProcessGrid(workers_, {.pipeline = options_.pipelineStages,
                                       .tensor = options_.tensorParallel,
                                       .order = options_.gridOrder});
  }
  if (options_.linearScaling) {
    const int replicas = onGrid(options_.strategy) ? grid_->dataSize : workers_->size();
    lrScale_ = replicas;
    if (options_.referenceBatch > 0) {
      const int64_t global = options_.batch * options_.accumulate * replicas;
      require(global % options_.referenceBatch == 0,
              "Trainer: referenceBatch {} must divide the global batch {} (batch x accumulate "
              "x {} replicas)",
              options_.referenceBatch, global, replicas);
      lrScale_ = static_cast<int>(global / options_.referenceBatch);
    }
  }
  watchStragglers();
  operationTimes_ = std::make_shared<comm::OperationTimeLog>();
  timeOperations(workers_);
  if (grid_) {
    for (const auto& g : {grid_->tensor, grid_->pipe, grid_->data}) timeOperations(g);
  }
}

void Trainer::watchStragglers() {
  if (options_.stragglerWindow <= 0) return;
  // Phases under a millisecond per step on the median rank are not judged: a data phase of
  // 0.2 ms against 0.1 ms is 2x and harmless beside steps of tens of milliseconds.
  stragglers_.emplace(workers_, comm::StragglerOptions{.phases = {"compute", "data"},
                                                       .window = options_.stragglerWindow,
                                                       .threshold = options_.stragglerThreshold,
                                                       .minSeconds = 1e-3});
}

void Trainer::timeOperations(const std::shared_ptr<comm::Group>& group) {
  if (!group || std::find(timedGroups_.begin(), timedGroups_.end(), group) != timedGroups_.end()) {
    return;
  }
  group->engine().logOperationTimes(operationTimes_);
  timedGroups_.push_back(group);
}

void Trainer::addCallback(std::shared_ptr<Callback> callback) {
  require(callback != nullptr, "Trainer: null callback");
  callbacks_.push_back(std::move(callback));
}

void Trainer::ensureStrategy(int64_t totalSteps, const torch::Tensor& sample) {
  if (strategy_) return;
  // The pipeline plans with one micro-batch of a replica's share.
  const int64_t rows = std::min<int64_t>(
      sample.size(0),
      std::max<int64_t>(1, options_.batch / std::max(1, options_.pipeline.microBatches)));
  const StrategyInputs in{ctx_,
                          workers_,
                          module_,
                          sequential_,
                          options_,
                          loss_,
                          totalSteps,
                          grid_ ? &*grid_ : nullptr,
                          sample.narrow(0, 0, rows)};
  if (options_.strategy == Strategy::kDdp) {
    strategy_ = makeDdpStrategy(in);
  } else if (isZero(options_.strategy)) {
    strategy_ = makeZeroStrategy(in);
  } else if (onGrid(options_.strategy)) {
    strategy_ = makeHybridStrategy(in);
  } else {
    strategy_ = makePsStrategy(in);
  }
}

torch::Tensor Trainer::forward(const torch::Tensor& input) {
  return strategy_ && strategy_->ownsForward() ? strategy_->forward(input) : forward_(input);
}

// The parameter servers' schedule (common/optimizer_config.h), scaled by lrScale_.
double Trainer::learningRate(int64_t step) const {
  return LrSchedule(options_.optimizer.lr, lrScale_, options_.linearScaling, options_.warmupSteps,
                    options_.cosineDecay ? totalSteps_ : 0)
      .at(step);
}

CommunicationTotals Trainer::communication() const {
  return strategy_ ? strategy_->communication() : CommunicationTotals{};
}

std::vector<EpochMetrics> Trainer::fit(const TensorDataset& train,
                                       const TensorDataset* validation) {
  require(train.inputs.defined() && train.targets.defined() && train.size() > 0 &&
              train.targets.size(0) == train.size(),
          "Trainer::fit: the training set needs inputs and targets of the same length > 0");
  if (ctx_.elastic) return fitElastic(train, validation);
  comm::Group& g = *workers_;
  // The grid strategies: every worker takes the same global batches (each replica its share of
  // them inside the strategy), whole ones only, so that every share is a full batch.
  const bool global = onGrid(options_.strategy);
  const int64_t batch = global ? options_.batch * grid_->dataSize : options_.batch;
  DistributedSampler sampler(train.size(), global ? 0 : g.rank(), global ? 1 : g.size(),
                             {.seed = options_.seed});
  const int64_t available = global ? sampler.perRank() / batch : sampler.batches(batch);
  require(available >= 1, "Trainer::fit: {} training samples do not make one global batch of {}",
          train.size(), batch);
  // The micro-batches of an epoch: its first stepsPerEpoch steps' worth when capped.
  const int64_t micro = options_.stepsPerEpoch > 0
                            ? std::min(available, options_.stepsPerEpoch * options_.accumulate)
                            : available;
  const int64_t stepsPerEpoch = (micro + options_.accumulate - 1) / options_.accumulate;
  totalSteps_ = stepsPerEpoch * options_.epochs;
  ensureStrategy(totalSteps_, train.inputs);

  if (options_.resume) {
    if (auto server = strategy_->serverStep()) {
      at_.step = *server;
      at_.epoch = *server / stepsPerEpoch;
      at_.batchInEpoch = (*server % stepsPerEpoch) * options_.accumulate;
    } else if (auto p = strategy_->load(options_.checkpointDir)) {
      at_ = *p;
    }
  }
  // Dropout differs per replica: its own stream, from the seed, the replica and the step,
  // seeded at every step so that a run resumed at any step draws what an uninterrupted one
  // does. A stage's tensor-parallel ranks share it, so their copies of a whole activation stay
  // the same (a split activation takes tensor::ShardedDropout, which draws a mask per rank from
  // this stream).
  const int stream =
      global ? grid_->dataRank * grid_->pipelineSize + grid_->pipelineRank : g.rank();
  for (auto& c : callbacks_) c->onFitStart(at_);

  // The job's timeline (SHOAL_TRACE; common/trace.h): data, forward, backward, optimizer step,
  // checkpoint and validation spans beside the collectives they cause.
  const std::shared_ptr<TraceSink>& trace = g.options().trace;
  std::vector<EpochMetrics> history;
  double sinceValidation[2] = {0, 0};  // loss, micro-batches
  Validations validations;
  lastReport_ = std::chrono::steady_clock::now();
  module_->train();
  for (; at_.epoch < options_.epochs; ++at_.epoch, at_.batchInEpoch = 0) {
    const auto started = std::chrono::steady_clock::now();
    const auto order = torch::tensor(sampler.indices(at_.epoch), torch::kInt64);
    double sums[3] = {0, 0, 0};  // loss, micro-batches, samples
    double trainSeconds = 0;     // in this epoch's steps
    double stepLoss = 0;
    StepInfo info;  // this step's, filled as its micro-batches run
    std::chrono::steady_clock::time_point stepStart;
    double waitedBefore = 0;
    const int64_t first = at_.batchInEpoch;
    for (int64_t b = first; b < micro; ++b) {
      const int64_t groupStart = b - b % options_.accumulate;
      const int64_t inGroup = std::min(options_.accumulate, micro - groupStart);
      const bool last = b + 1 == groupStart + inGroup;
      if (b == groupStart || b == first) {
        // A step's time starts at its first micro-batch (checkpoints and validations between
        // steps are not the step's).
        stepStart = std::chrono::steady_clock::now();
        waitedBefore = strategy_->commWaitSeconds();
        torch::manual_seed(
            mixSeed(options_.seed, static_cast<uint64_t>(stream), static_cast<uint64_t>(at_.step)));
      }
      torch::Tensor x, y;
      {
        TraceScope span(trace, "data", "train");
        const auto dataStart = std::chrono::steady_clock::now();
        const auto idx = order.slice(0, b * batch, std::min((b + 1) * batch, order.size(0)));
        x = train.inputs.index_select(0, idx);
        y = train.targets.index_select(0, idx);
        info.dataSeconds += secondsSince(dataStart);
        info.samples += x.size(0);
        info.jobSamples += global ? x.size(0) : x.size(0) * g.size();
        // The grid strategies give every worker the whole global batch: counted once.
        if (!global || g.rank() == 0) sums[2] += static_cast<double>(x.size(0));
      }
      double value = 0;
      if (strategy_->ownsStep()) {
        TraceScope span(trace, "forward and backward", "train");
        value = strategy_->trainStep(x, y);
      } else {
        // The step's gradient is the mean over its micro-batches, as one large batch's would be.
        value = forwardBackward(x, y, static_cast<double>(inGroup), last);
      }
      sums[0] += value;
      sums[1] += 1;
      sinceValidation[0] += value;
      sinceValidation[1] += 1;
      stepLoss += value / static_cast<double>(inGroup);
      at_.batchInEpoch = b + 1;
      if (!last) continue;
      info.epoch = at_.epoch;
      info.loss = stepLoss;
      info.batchInEpoch = b + 1;
      info.batchesInEpoch = micro;
      endStep(info, learningRate(at_.step), stepStart, waitedBefore);
      trainSeconds += info.seconds;
      info = StepInfo{};
      stepLoss = 0;
      if (!options_.checkpointDir.empty() && options_.checkpointEvery > 0 &&
          at_.step % options_.checkpointEvery == 0 && at_.batchInEpoch < micro) {
        TraceScope span(trace, "checkpoint", "train");
        strategy_->save(options_.checkpointDir, at_, options_.keep);
      }
      validateIfDue(validation, sinceValidation, validations);
    }
    sumOverWorkers(g, sums, 3);
    EpochMetrics m;
    m.epoch = at_.epoch;
    m.step = at_.step;
    m.trainLoss = sums[1] > 0 ? sums[0] / sums[1] : 0;
    m.samples = static_cast<int64_t>(sums[2]);
    m.trainSeconds = trainSeconds;
    addEpochValidation(m, validation, sinceValidation, validations);
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!options_.checkpointDir.empty()) {
      // Saved as the start of the next epoch, so a resume does not replay this one.
      TraceScope span(trace, "checkpoint", "train");
      strategy_->save(options_.checkpointDir, {at_.epoch + 1, 0, at_.step}, options_.keep);
    }
    for (auto& c : callbacks_) c->onEpoch(m);
    history.push_back(m);
  }
  strategy_->finish();
  return history;
}

double Trainer::forwardBackward(const torch::Tensor& x, const torch::Tensor& y, double divisor,
                                bool sync) {
  const std::shared_ptr<TraceSink>& trace = workers_->options().trace;
  torch::Tensor loss;
  {
    TraceScope span(trace, "forward", "train");
    strategy_->beforeForward();
    AutocastGuard autocast(options_.precision);
    loss = loss_(forward(x), y);
  }
  {
    TraceScope span(trace, sync ? "backward" : "backward (accumulate)", "train");
    strategy_->backward(loss / divisor, sync);
  }
  return loss.item<double>();
}

void Trainer::endStep(StepInfo& info, double lr, std::chrono::steady_clock::time_point started,
                      double waitedBefore) {
  {
    TraceScope span(workers_->options().trace, "optimizer step", "train");
    span.arg("step", at_.step);
    strategy_->step(at_.step, lr, options_.clipNorm);
  }
  ++at_.step;
  info.step = at_.step;
  info.lr = lr;
  finishStep(info, started, waitedBefore);
  for (auto& c : callbacks_) c->onStep(info);
}

void Trainer::finishStep(StepInfo& info, std::chrono::steady_clock::time_point started,
                         double waitedBefore) {
  const auto ended = std::chrono::steady_clock::now();
  info.seconds = std::chrono::duration<double>(ended - started).count();
  info.commWaitSeconds = std::max(0.0, strategy_->commWaitSeconds() - waitedBefore);
  splitStepTime(info, {started, ended});
  // The autotuner compares the steps without their data (the same for every candidate).
  if (auto choice = strategy_->noteStepTime(std::max(0.0, info.seconds - info.dataSeconds))) {
    info.autotuneChoice = choice->index;
    info.autotuned = std::move(choice->description);
  }
  if (stragglers_) {
    // Waiting for a straggler makes everyone's communication slow: it is no phase of its own.
    const double phases[2] = {std::max(0.0, info.computeSeconds - info.dataSeconds),
                              info.dataSeconds};
    lastStragglers_ = stragglers_->step(phases);
    info.stragglers = lastStragglers_ ? &*lastStragglers_ : nullptr;
  }
}

void Trainer::splitStepTime(StepInfo& info, comm::TimeSpan step) {
  std::vector<comm::TimeSpan> waits;
  strategy_->waitSpans(step.begin, waits);
  // Every record since the last step: those of operations between steps (validation,
  // checkpoints) fall outside this step's span.
  const auto ops = operationTimes_->take();
  const comm::BlockedTime blocked =
      comm::splitBlockedTime(ops, waits, std::this_thread::get_id(), step);
  info.waitingSeconds = blocked.waitingSeconds;
  info.communicationSeconds = blocked.communicationSeconds;
  info.computeSeconds =
      std::max(0.0, info.seconds - info.waitingSeconds - info.communicationSeconds);
}

EpochMetrics Trainer::validate(const TensorDataset& data) {
  require(data.inputs.defined() && data.targets.defined() && data.targets.size(0) == data.size(),
          "Trainer::validate: the data needs inputs and targets of the same length");
  require(data.size() > 0, "Trainer::validate: the data is empty");
  ensureStrategy(totalSteps_, data.inputs);
  comm::Group& g = *workers_;
  TraceScope span(g.options().trace, "validate", "train");
  strategy_->beforeValidation(at_.step);
  torch::NoGradGuard noGrad;
  module_->eval();
  double sums[3] = {0, 0, 0};  // loss x samples, correct, samples
  const bool classes = data.targets.dim() == 1 && data.targets.scalar_type() == torch::kInt64;
  if (strategy_->ownsStep()) {
    // Every worker takes the same chunks; the strategy gives each replica its share.
    const int64_t chunk = 256 * grid_->dataSize;
    for (int64_t at = 0; at < data.size(); at += chunk) {
      const int64_t n = std::min(chunk, data.size() - at);
      const auto part =
          strategy_->evaluate(data.inputs.narrow(0, at, n), data.targets.narrow(0, at, n), classes);
      for (size_t i = 0; i < part.size(); ++i) sums[i] += part[i];
    }
  } else {
    const auto mine = torch::arange(g.rank(), data.size(), g.size(), torch::kInt64);
    for (int64_t at = 0; at < mine.size(0); at += 256) {
      const auto idx = mine.slice(0, at, std::min<int64_t>(at + 256, mine.size(0)));
      const auto y = data.targets.index_select(0, idx);
      torch::Tensor out;
      {
        AutocastGuard autocast(options_.precision);
        out = forward(data.inputs.index_select(0, idx));
        sums[0] += loss_(out, y).item<double>() * static_cast<double>(idx.size(0));
      }
      if (classes) sums[1] += static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>());
      sums[2] += static_cast<double>(idx.size(0));
    }
  }
  module_->train();
  sumOverWorkers(g, sums, 3);
  EpochMetrics m;
  m.epoch = at_.epoch;
  m.step = at_.step;
  m.validationLoss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  m.validationPerplexity = std::exp(m.validationLoss);
  m.validationAccuracy = classes && sums[2] > 0 ? sums[1] / sums[2] : -1;
  return m;
}

EpochMetrics Trainer::validateAndReport(const TensorDataset& data, double since[2]) {
  sumOverWorkers(*workers_, since, 2);
  EpochMetrics m = validate(data);
  m.trainLoss = since[1] > 0 ? since[0] / since[1] : 0;
  since[0] = since[1] = 0;
  const auto now = std::chrono::steady_clock::now();
  m.seconds = std::chrono::duration<double>(now - lastReport_).count();
  lastReport_ = now;
  for (auto& c : callbacks_) c->onValidation(m);
  return m;
}

void Trainer::validateIfDue(const TensorDataset* validation, double since[2], Validations& done) {
  if (!validation || options_.validateEvery <= 0 || at_.step % options_.validateEvery != 0) return;
  done.last = validateAndReport(*validation, since);
  done.step = at_.step;
}

void Trainer::addEpochValidation(EpochMetrics& m, const TensorDataset* validation, double since[2],
                                 Validations& done) {
  if (!validation) return;
  if (done.step != at_.step) done.last = validateAndReport(*validation, since);
  m.validationLoss = done.last.validationLoss;
  m.validationPerplexity = done.last.validationPerplexity;
  m.validationAccuracy = done.last.validationAccuracy;
}

FullState Trainer::gatherFullState() {
  if (onGrid(options_.strategy)) {
    require(strategy_ != nullptr,
            "Trainer::gatherFullState: strategy {} splits the model in fit(); "
            "gather after it",
            toString(options_.strategy));
    return strategy_->hybrid()->gatherFullState();
  }
  // A replica is whole on every worker (ZeRO-1 and 2 shard only gradients and optimizer state).
  require(options_.strategy == Strategy::kDdp || options_.strategy == Strategy::kZero1 ||
              options_.strategy == Strategy::kZero2,
          "Trainer::gatherFullState: strategy {} keeps no whole model on a worker (zero3: "
          "consolidate a checkpoint, train/reshard_checkpoint.h)",
          toString(options_.strategy));
  return train::gatherFullState(*module_);
}

pipeline::Pipeline* Trainer::pipeline() {
  HybridParallel* model = strategy_ ? strategy_->hybrid() : nullptr;
  return model ? model->pipeline() : nullptr;
}

const LossScaler* Trainer::lossScaler() const {
  HybridParallel* model = strategy_ ? strategy_->hybrid() : nullptr;
  return model ? &model->scaler() : nullptr;
}

}  // namespace shoal::train
