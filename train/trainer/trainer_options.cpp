// The Trainer's options and context, checked (train/trainer/trainer_options.h), and the
// strategies' names.
#include "train/trainer/trainer_options.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>

#include "common/error.h"
#include "train/trainer/loop_common.h"

namespace shoal::train {

using loop::require;

namespace {

constexpr std::pair<std::string_view, Strategy> kStrategies[] = {
    {"ddp", Strategy::kDdp},
    {"zero1", Strategy::kZero1},
    {"zero2", Strategy::kZero2},
    {"zero3", Strategy::kZero3},
    {"ps", Strategy::kParameterServer},
    {"pipeline", Strategy::kPipeline},
    {"tensor", Strategy::kTensor},
    {"hybrid", Strategy::kHybrid},
};

void validateGridOptions(const TrainerOptions& o) {
  const std::string_view name = toString(o.strategy);
  require(o.pipelineStages >= 1 && o.tensorParallel >= 1,
          "Trainer: pipelineStages and tensorParallel must be at least 1, not {} and {}",
          o.pipelineStages, o.tensorParallel);
  if (!onGrid(o.strategy)) {
    require(o.pipelineStages == 1 && o.tensorParallel == 1,
            "Trainer: strategy {} does not split the model; pipelineStages {} and "
            "tensorParallel {} need strategy pipeline, tensor or hybrid",
            name, o.pipelineStages, o.tensorParallel);
    return;
  }
  require(o.strategy != Strategy::kPipeline || (o.pipelineStages >= 2 && o.tensorParallel == 1),
          "Trainer: strategy pipeline needs pipelineStages >= 2 and tensorParallel 1 (not {} "
          "and {}; hybrid combines them)",
          o.pipelineStages, o.tensorParallel);
  require(o.strategy != Strategy::kTensor || (o.tensorParallel >= 2 && o.pipelineStages == 1),
          "Trainer: strategy tensor needs tensorParallel >= 2 and pipelineStages 1 (not {} "
          "and {}; hybrid combines them)",
          o.tensorParallel, o.pipelineStages);
  require(o.accumulate == 1,
          "Trainer: strategy {} accumulates over the pipeline's micro-batches; accumulate "
          "must be 1, not {}",
          name, o.accumulate);
  require(o.pipelineStages == 1 || o.pipeline.microBatches <= o.batch,
          "Trainer: {} pipeline micro-batches do not fit in a batch of {} per replica",
          o.pipeline.microBatches, o.batch);
  require(o.precision != Precision::kFloat16 || o.clipNorm == 0,
          "Trainer: fp16 with clipping is not supported (the gradients are still loss-scaled "
          "when the clip would apply); use bf16 or leave clipNorm 0");
}

}  // namespace

bool isZero(Strategy s) {
  return s == Strategy::kZero1 || s == Strategy::kZero2 || s == Strategy::kZero3;
}

// The strategies that split the model over a process grid (train/trainer/hybrid_strategy.cpp).
bool onGrid(Strategy s) {
  return s == Strategy::kPipeline || s == Strategy::kTensor || s == Strategy::kHybrid;
}

void validateOptions(const TrainerOptions& o) {
  require(o.epochs >= 1, "Trainer: epochs must be at least 1, not {}", o.epochs);
  require(o.stepsPerEpoch >= 0 && o.validateEvery >= 0,
          "Trainer: stepsPerEpoch and validateEvery must be >= 0, not {} and {}", o.stepsPerEpoch,
          o.validateEvery);
  require(o.batch >= 1, "Trainer: batch must be at least 1, not {}", o.batch);
  require(o.accumulate >= 1, "Trainer: accumulate must be at least 1, not {}", o.accumulate);
  require(o.clipNorm >= 0 && std::isfinite(o.clipNorm),
          "Trainer: clipNorm must be a finite number >= 0, not {}", o.clipNorm);
  require(o.optimizer.lr > 0 && std::isfinite(o.optimizer.lr),
          "Trainer: the learning rate must be positive, not {}", o.optimizer.lr);
  require(o.precision != Precision::kFloat16 || onGrid(o.strategy),
          "Trainer: precision fp16 needs loss scaling and fp16 weights, which the Trainer "
          "drives only under pipeline, tensor or hybrid; use fp32 or bf16, or "
          "train/mixed_precision.h directly");
  require(o.checkpointEvery >= 0 && o.keep >= 1,
          "Trainer: checkpointEvery must be >= 0 and keep >= 1");
  require(!o.resume || !o.checkpointDir.empty() || o.strategy == Strategy::kParameterServer,
          "Trainer: resume needs checkpointDir");
  require(
      !o.compression.enabled() || o.strategy == Strategy::kDdp || o.strategy == Strategy::kZero1,
      "Trainer: compression {} is the all-reduce's (strategies ddp and zero1); strategy "
      "{} cannot use it{}",
      o.compression.toString(), toString(o.strategy),
      o.strategy == Strategy::kParameterServer ? " (ps: psClient.compression)" : "");
  // The codec's momentum (compression_hook.h) replaces the optimizer's: with both, every
  // gradient would get momentum twice; and what the hook leaves is an update, not a gradient
  // for Adam's moments or for clipping.
  const bool sgd = o.optimizer.kind == OptimizerKind::kSgd;
  require(o.compression.momentum == 0 || (sgd && o.optimizer.momentum == 0),
          "Trainer: compression {} applies the momentum itself; the optimizer must be sgd with "
          "momentum 0, not {}",
          o.compression.toString(),
          sgd ? fmt::format("sgd with momentum {}", o.optimizer.momentum)
              : std::string(toString(o.optimizer.kind)));
  require(o.compression.momentum == 0 || o.clipNorm == 0,
          "Trainer: compression {} sends momentum updates, not gradients; clipNorm {} would clip "
          "those (use clipNorm 0)",
          o.compression.toString(), o.clipNorm);
  require(!o.autotune || o.strategy == Strategy::kDdp,
          "Trainer: autotune chooses ddp's buckets; strategy {} has none to tune",
          toString(o.strategy));
  require(o.stragglerWindow >= 0, "Trainer: stragglerWindow must be >= 0, not {}",
          o.stragglerWindow);
  require(std::isfinite(o.stragglerThreshold) && o.stragglerThreshold > 1,
          "Trainer: stragglerThreshold must be a finite number above 1, not {}",
          o.stragglerThreshold);
  require(o.referenceBatch >= 0 && (o.referenceBatch == 0 || o.linearScaling),
          "Trainer: referenceBatch {} needs linearScaling (it says what to scale by)",
          o.referenceBatch);
  require(o.referenceBatch == 0 || o.strategy != Strategy::kParameterServer,
          "Trainer: the parameter servers scale the rate by the workers; referenceBatch {} "
          "is not theirs",
          o.referenceBatch);
  validateGridOptions(o);
}

void validateContext(const TrainerOptions& o, const TrainerContext& ctx) {
  const int numWorkers = ctx.world->size() - ctx.numServers;
  require(ctx.numServers >= 0 && numWorkers >= 1,
          "Trainer: {} parameter servers in a world of {} leave no worker", ctx.numServers,
          ctx.world->size());
  require(ctx.numServers == 0 || o.strategy == Strategy::kParameterServer,
          "Trainer: the job has {} parameter servers but the strategy is {} (use ps)",
          ctx.numServers, toString(o.strategy));
  require(ctx.world->rank() < numWorkers,
          "Trainer: rank {} is a parameter server; its program serves (ps::serve) instead",
          ctx.world->rank());
  require(o.scheduleWorkers >= 0 && (o.scheduleWorkers == 0 || ctx.elastic),
          "Trainer: scheduleWorkers {} is for elastic jobs (and >= 0)", o.scheduleWorkers);
  if (ctx.elastic) {
    // What an elastic job keeps through a view change is a DDP replica's state
    // (train/elastic_replicated.h) or ZeRO-1/2's shards (train/zero/zero_elastic.h); ZeRO-3's
    // parameters, the servers and the grids are not carried (yet), and the autotuner's and
    // referenceBatch's choices assume one world size.
    require(o.strategy == Strategy::kDdp || o.strategy == Strategy::kZero1 ||
                o.strategy == Strategy::kZero2,
            "Trainer: an elastic job (shoal run --elastic) trains with strategy ddp, zero1 or "
            "zero2; {} is not elastic (run it without --elastic, with --max-restarts to restart "
            "from its checkpoints)",
            toString(o.strategy));
    require(!o.autotune,
            "Trainer: autotune compares its trials at one world size, and an elastic job's "
            "size changes");
    require(o.referenceBatch == 0,
            "Trainer: referenceBatch {} fixes the global batch; an elastic job's changes with its "
            "size (linearScaling alone scales by the view's size)",
            o.referenceBatch);
  }
}

Strategy parseStrategy(std::string_view name) {
  for (const auto& [n, s] : kStrategies) {
    if (n == name) return s;
  }
  SHOAL_THROW(InvalidArgument,
              "unknown strategy '{}' (choose ddp, zero1, zero2, zero3, ps, pipeline, tensor or "
              "hybrid)",
              name);
}

std::string_view toString(Strategy s) {
  for (const auto& [n, v] : kStrategies) {
    if (v == s) return n;
  }
  return "unknown";
}

}  // namespace shoal::train
