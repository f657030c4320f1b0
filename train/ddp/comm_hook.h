// What DistributedDataParallel does to a bucket of gradients once every gradient in it is ready:
// the communication hook. The reducer (train/ddp/reducer.h) decides *when* a bucket is ready and
// in which order buckets go; the hook decides *what* is done to it. The default averages with
// one all-reduce; ZeRO plugs in a reduce-scatter into a shard it keeps in its bucket state,
// compression an encode → collective → decode with error-feedback residuals in the state.
//
//   struct SumHook : shoal::train::ddp::CommHook {
//     std::shared_ptr<comm::Work> start(comm::Group& g, GradBucket& b) override {
//       return comm::allreduceAsync(g, b.buffer.data_ptr(), b.buffer.numel(), ..., kSum);
//     }
//   };
//   options.commHook = std::make_shared<SumHook>();
//
// Contract for implementers:
// - Collective order. Every rank calls start() for the same buckets in the same order (bucket
//   index 0 first), then finish() in the same order. A hook must issue the same collectives on
//   every rank for a given bucket (collectives match by order; a disagreement is a
//   MismatchError on every rank).
// - Threads. start() runs on the thread that runs backward (autograd's hooks; for CPU tensors
//   the caller of backward), or on the training thread from finishGradientSync(); finish() and
//   makeState() on the training thread. Never two calls at once for one reducer.
// - Buffers. bucket.buffer holds the bucket's gradients, flat and contiguous, one dtype; each
//   parameter's .grad is a view into it (parameter k of the bucket at offsets[k], numels[k]
//   elements). From start() until the returned Work completes the buffer belongs to the hook's
//   communication; when finish() returns, the buffer must hold the gradients the optimizer
//   should see (e.g. the average).
// - Errors. Anything start() or finish() throws, or the Work fails with, reaches the caller of
//   backward() / finishGradientSync() unchanged (same type and message), after the reducer has
//   waited for every other bucket's communication still in flight.
// - Blocking. start() must not block on communication (it runs inside backward, where it would
//   serialize compute and communication); finish() may, e.g. a second collective of a
//   two-step scheme, and should bound it with the group's timeout (comm's calls do).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/work.h"
#include "common/types.h"

namespace shoal::train::ddp {

// A hook's own data for one bucket (a residual, a receive shard, a compressed buffer),
// created by CommHook::makeState and kept by the reducer as long as the bucket layout lives.
struct BucketState {
  virtual ~BucketState() = default;
};

// One bucket as the reducer hands it to its hook. Not copyable (holds the state).
struct GradBucket {
  size_t index = 0;              // launch order: 0 goes first (roughly the last layers)
  torch::Tensor buffer;          // flat, contiguous; the parameters' .grad are views into it
  std::vector<size_t> params;    // parameter indices (registration order of the trainable ones)
  std::vector<int64_t> offsets;  // element offset of each parameter's gradient in buffer
  std::vector<int64_t> numels;   // elements of each parameter
  std::vector<std::vector<int64_t>> shapes;  // each parameter's shape (PowerSGD's matrices)
  uint64_t layoutVersion = 0;                // grows by one whenever the buckets are rebuilt
  std::unique_ptr<BucketState> state;        // from CommHook::makeState (may be null)

  // The state as the hook's own type; InternalError if it is not one.
  template <class T>
  T& stateAs() const {
    auto* s = dynamic_cast<T*>(state.get());
    if (!s) throwWrongState();
    return *s;
  }

 private:
  [[noreturn]] void throwWrongState() const;
};

// What a hook carries from one step to the next on this rank, for a checkpoint to save and a
// resumed job to restore so that it goes on exactly as if it had not stopped
// (train/hook_checkpoint.h). Tensors are keyed by a name of the hook's ("residual") and a
// parameter index (GradBucket::params); each is a 1-D contiguous float32 copy.
struct HookState {
  // What the state means: the same only between hooks whose state fits one another ("topk",
  // "powersgd:2"); a checkpoint's state is loaded only into a hook of the same kind.
  std::string kind;
  int64_t steps = 0;  // synchronized steps the hook has seen (the end of a warm-up counts them)
  struct Tensor {
    std::string key;
    size_t param = 0;
    // Every rank has its own (an error-feedback residual), or all hold the same values (a
    // warm start agreed by a collective): a job at another world size gets the mean of the
    // former over the ranks that saved it, and rank 0's copy of the latter.
    bool perRank = true;
    torch::Tensor data;
  };
  std::vector<Tensor> tensors;

  // Puts `tensors` in one order on every rank (by key, then parameter): hooks export from
  // unordered maps.
  void sortTensors();
};

class CommHook {
 public:
  virtual ~CommHook() = default;

  // Called for every bucket whenever the buckets are (re)built: at construction and once more
  // after the first synchronized iteration, when the layout follows the order in which
  // gradients became ready (layoutVersion tells them apart). State that must survive a
  // rebuild (error-feedback residuals) is best kept per parameter (bucket.params) by the hook.
  // The buffer holds no meaningful gradients yet. Default: no state.
  virtual std::unique_ptr<BucketState> makeState(comm::Group& group, const GradBucket& bucket);

  // Starts the bucket's communication without waiting for it. Returns the Work the reducer
  // waits on before finish(), or null if nothing is left in flight.
  virtual std::shared_ptr<comm::Work> start(comm::Group& group, GradBucket& bucket) = 0;

  // After start()'s Work completed successfully: turns what arrived into the gradients
  // (decode, scatter a shard, apply residuals). Default: nothing.
  virtual void finish(comm::Group& group, GradBucket& bucket);

  // For messages: what the hook does ("average all-reduce").
  virtual std::string name() const = 0;

  // The kind of state this hook keeps from step to step (HookState::kind); empty for none
  // (the default).
  virtual std::string stateKind() const;
  // This rank's state as views of the hook's own tensors (no copy: what keeps a copy at every
  // step reuses its own buffers), or nothing for a hook that keeps none (the default). Read the
  // views before the hook's next step or import, and never write them. Training thread,
  // between steps.
  virtual std::optional<HookState> viewState() const;
  // viewState(), copied: the caller's to keep.
  std::optional<HookState> exportState() const;
  // Restores a state exported by a hook of the same kind, after the buckets were made (the
  // values land in the state of the parameters' buckets). The hook's state becomes `state`:
  // what it held before is dropped. InvalidArgument, changing nothing, when it does not fit:
  // another kind, a parameter this hook has no bucket for, another size. The default (a
  // stateless hook) refuses any. Training thread, between steps.
  virtual void importState(const HookState& state);
};

// One all-reduce of the whole bucket with `op`. With ReduceOp::kAvg (the default hook) the
// division by the world size is done by the collective itself, not by a pass of the reducer.
class AllreduceHook : public CommHook {
 public:
  explicit AllreduceHook(ReduceOp op = ReduceOp::kAvg, comm::CallOptions call = {})
      : op_(op), call_(call) {}
  std::shared_ptr<comm::Work> start(comm::Group& group, GradBucket& bucket) override;
  std::string name() const override;

 private:
  ReduceOp op_;
  comm::CallOptions call_;
};

// The default hook: the average over ranks with one all-reduce per bucket.
std::shared_ptr<CommHook> averageAllreduce();

}  // namespace shoal::train::ddp
