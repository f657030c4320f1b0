// ZeRO: data parallelism that shards what DDP replicates (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020).
//
//   shoal::train::zero::ZeroOptions o;
//   o.stage = 2;
//   o.optimizer = {OptimizerKind::kAdam, 1e-3};
//   shoal::train::zero::ZeroDataParallel zero(model, world.group, o);
//   for (...) {
//     zero.beforeForward();                  // stage 3: nothing to gather yet (see forward())
//     auto loss = loss_fn(zero.forward(x), y);   // or model->forward(x) for stages 1-2
//     zero.backward(loss);                   // gradients reduced into their owners' shards
//     zero.step();                           // each rank steps its shard; parameters gathered
//   }
//
// The stages (Ψ parameters, N ranks; bytes per rank for fp32 Adam):
//   1  optimizer state sharded. Gradients are all-reduced as in DDP (full gradient buffers
//      held: 4Ψ); each rank steps its shard and the updated parameters are all-gathered.
//      8Ψ + 8Ψ/N.
//   2  gradients sharded too: each bucket is reduce-scattered into its owners' shards while
//      backward goes on, and the full bucket is freed once sent. 4Ψ + 12Ψ/N.
//   3  parameters sharded too: a unit's full parameters exist only while its forward or its
//      backward runs (gathered just before, prefetching the next unit's while this one
//      computes; freed after). 16Ψ/N plus the gathered working set.
// With a bf16/fp16 module (compute copies) the shard's master parameters are fp32 and counted
// with the optimizer state: 1: 2Ψ + 2Ψ + 16Ψ/N; 2: 2Ψ + 16Ψ/N; 3: 16Ψ/N (the fp32 gradient
// shard is the optimizer's input, 4Ψ/N in each).
//
// Layout (Note [Shard units] in zero.cpp): the trainable parameters are grouped into units
// (stages 1-2: buckets of about bucketBytes in reverse registration order, the order backward
// produces gradients; stage 3: the Sequential's children). A unit's parameters live end to end
// in one flat buffer padded to a multiple of N; rank r owns the r-th 1/N of every unit. The
// module's parameters are views into the units' buffers, so an all-gather writes straight into
// them. Every rank computes the same layout from the same parameter list.
//
// Optimizers: SGD (momentum), Adam, RMSprop run libtorch's own implementations over the flat
// shards: their formulas are elementwise, so the result equals DDP's (within rounding).
// LAMB and LARS compute each layer's norms across the shards that hold it. Gradient clipping
// by global norm sums the squares over all shards.
//
// Stage 3 needs a torch::nn::Sequential whose forward goes through forward() here: libtorch's
// C++ modules have no forward hooks, so the wrapper drives the units itself. Stages 1 and 2
// take any module.
//
// Errors: a failed collective (TimeoutError, PeerError naming the rank that failed, ...)
// reaches the caller of backward()/step()/forward() unchanged, after the communication still
// in flight has been waited for. InvalidArgument for bad options (stage, a stage-3 module
// that is not a Sequential, an optimizer it cannot shard), MismatchError when ranks registered
// different parameters.
//
// Threading: one training thread per rank. Not copyable. The module must outlive this object.
// Collective: every method that communicates (the constructor, beforeForward, forward,
// backward, step, gathered parameters, save/load) must be called by every rank in the same
// order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/checkpoint.h"
#include "train/ddp/comm_hook.h"
#include "train/optim.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train::zero {

struct ZeroOptions {
  int stage = 1;  // 1, 2 or 3 (stage 0 is DistributedDataParallel)
  // Stages 1-2: the gradient buckets, which are also the units the parameters are sharded by.
  size_t bucketBytes = 25u << 20;
  OptimizerOptions optimizer;
  // > 0: scale the gradients so that their global L2 norm (over every shard) is at most this,
  // as torch::nn::utils::clip_grad_norm_ does.
  double clipNorm = 0;
  // Stage 3: keep each unit's gathered parameters from its forward to its backward (one
  // all-gather per unit per step instead of two, at the memory of the full parameters).
  bool keepParametersForBackward = false;
  // Stage 3: gather the next unit's parameters while the current one computes.
  bool prefetch = true;
  // Stages 2-3: at most this many units' gradient reductions in flight (each holds its unit's full
  // gradients until sent); backward waits for the oldest beyond it. 0: no limit.
  size_t maxInFlightReductions = 2;
  // Copy rank 0's buffers (BatchNorm statistics) to every rank in beforeForward().
  bool broadcastBuffers = true;
  // Stage 1: what is done to each unit's full gradients (a DDP communication hook, e.g.
  // ddp::compressionHook); null: the average all-reduce. The units are its buckets (index in
  // reduction order; the buffer is padded to a multiple of the world size with zeros). Stages
  // 2-3 reduce-scatter and take none (InvalidArgument).
  std::shared_ptr<ddp::CommHook> commHook;
};

// Bytes this rank holds, from the tensors themselves (each storage counted once, at its
// current size).
struct MemoryReport {
  int64_t parameterBytes = 0;     // the module's parameters as allocated now (+ fp32 master
                                  // shards when they are the parameters, stage 3 fp32)
  int64_t gradientBytes = 0;      // full gradient buffers allocated now + the gradient shards
  int64_t optimizerBytes = 0;     // optimizer state of the shard (+ fp32 masters of a bf16/fp16
                                  // module)
  int64_t spareBytes = 0;         // freed full parameters and gradients kept for the next unit of
                                  // their size (Note [Spare blocks] in zero_impl.h): part of stage
                                  // 2-3's working set, not of the formulas
  int64_t peakResidentBytes = 0;  // the process's peak RSS (VmHWM)
  int64_t total() const { return parameterBytes + gradientBytes + optimizerBytes; }
};

class ZeroDataParallel {
 public:
  // Stages 1-2 (any module) and 3 (needs the Sequential constructor below: InvalidArgument).
  ZeroDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<comm::Group> group,
                   ZeroOptions options);
  // Any stage; stage 3's units are the Sequential's children that hold parameters.
  ZeroDataParallel(torch::nn::Sequential module, std::shared_ptr<comm::Group> group,
                   ZeroOptions options);
  ~ZeroDataParallel();
  ZeroDataParallel(const ZeroDataParallel&) = delete;
  ZeroDataParallel& operator=(const ZeroDataParallel&) = delete;

  // Broadcasts rank 0's buffers (if enabled). Blocking, bounded by the group's timeout.
  void beforeForward();

  // The Sequential's forward, unit by unit; in stage 3 each unit's parameters are gathered
  // before it runs and freed after (unless keepParametersForBackward). InvalidArgument when
  // constructed from a plain module.
  torch::Tensor forward(const torch::Tensor& input);

  // loss.backward(), then the gradients' reduction: stage 1 all-reduce, stages 2-3
  // reduce-scatter into the owners' shards. Under noSync() only local accumulation (stage 2-3:
  // the full gradient buffers stay allocated until the synchronized backward).
  void backward(const torch::Tensor& loss);

  // Steps this rank's shard with the averaged gradients (clipped first if clipNorm > 0),
  // clears the gradients, and (stages 1-2) all-gathers the updated parameters into the module.
  // Returns the global gradient norm before clipping (computed only when clipping or asked
  // for by a layer-wise optimizer; otherwise -1).
  double step();

  void setLearningRate(double lr);

  class NoSyncGuard {
   public:
    explicit NoSyncGuard(ZeroDataParallel& z) : z_(z) { z_.sync_ = false; }
    ~NoSyncGuard() { z_.sync_ = true; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    ZeroDataParallel& z_;
  };
  NoSyncGuard noSync() { return NoSyncGuard(*this); }

  // Stage 3: while the guard lives, every unit's full parameters are gathered in the module
  // (for evaluation, export, comparing with DDP). Stages 1-2: the module always has them.
  class GatheredParameters {
   public:
    explicit GatheredParameters(ZeroDataParallel& z);
    ~GatheredParameters();
    GatheredParameters(const GatheredParameters&) = delete;
    GatheredParameters& operator=(const GatheredParameters&) = delete;

   private:
    ZeroDataParallel& z_;
  };

  MemoryReport memory() const;

  // The number of trainable parameters (Ψ) and of padding elements added by the layout.
  int64_t parameterCount() const;
  int64_t paddingCount() const;
  int stage() const;
  comm::Group& group();

  // Sharded checkpoints (train/reshard_checkpoint.h): every rank writes its shard of the
  // master parameters and optimizer state; rank 0 the buffers. Collective.
  std::string save(const std::string& dir, const Progress& progress, int keep = 2);
  // Loads the newest (or the given) checkpoint in dir, written by any ZeRO stage or DDP at any
  // world size, resharding to this one. Nothing when dir has no checkpoint. Collective.
  std::optional<Progress> load(const std::string& dir, std::optional<int64_t> step = {});

  // Elastic training (train/zero/zero_elastic.h). This rank's state as pieces named as a
  // sharded checkpoint names them (train/state_shards.h: its master parameters and optimizer
  // state, every buffer), and the optimizer's step count. Local.
  std::vector<FlatPiece> statePieces(int64_t& optimizerStep) const;
  // This rank's shards from whole flat tensors by those names, then (stages 1-2) the
  // parameters gathered. Collective. InvalidArgument (on every rank) naming a tensor missing or
  // of another size; nothing changes then.
  void loadState(const std::map<std::string, torch::Tensor>& whole, int64_t optimizerStep);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  bool sync_ = true;
};

}  // namespace shoal::train::zero
