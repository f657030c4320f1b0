// The reducer: DistributedDataParallel's gradient machinery below the module wrapper. It
// groups parameters into buckets, watches autograd for each gradient, hands every complete
// bucket to a communication hook (train/ddp/comm_hook.h) in bucket order, waits for them at the
// end of backward, and rebuilds the buckets once, after the first synchronized iteration, in
// the order the gradients actually became ready on rank 0.
//
// Note [Gradients as bucket views]
// Each parameter's .grad is a view into its bucket's flat buffer, so backward's accumulation
// (libtorch's AccumulateGrad: `grad += new` when a gradient exists) writes straight into the
// bucket and the hook's result is what the optimizer reads: no copy into the bucket and back.
// The view is (re)established right before each gradient is accumulated (a pre-hook on the
// parameter's AccumulateGrad node): if .grad is not the view any more, because the user set it
// to none (Module::zero_grad(true)), assigned another tensor, or the buckets were rebuilt, its
// value (or zero) is copied into the view once and .grad points at the view again. An
// in-place zero_grad() (libtorch 1.13's Optimizer::zero_grad) keeps the views. Under noSync()
// the views accumulate locally; the next synchronized backward reduces the accumulated sum.
// After finishGradientSync() every parameter's .grad is its view, holding the hook's result.
// ("View" in the sense of sharing the bucket's memory: to autograd it is a plain tensor, since
// libtorch 1.13's Optimizer::zero_grad() calls detach_(), which autograd refuses on views.)
//
// Threading: one training thread; the autograd hooks run on the thread that runs backward (for
// CPU tensors the caller of backward()). Not copyable. The parameters must outlive the reducer;
// its autograd hooks stay on their AccumulateGrad nodes but do nothing once it is destroyed.
#pragma once

#include <torch/torch.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/ddp/comm_hook.h"

namespace torch::autograd {
struct Node;
}

namespace shoal::train::ddp {

struct ReducerOptions {
  size_t bucketBytes = 25u << 20;
  size_t firstBucketBytes = 1u << 20;  // small, so communication starts early in backward
  bool overlap = true;                 // start buckets during backward (else all at the end)
  bool findUnusedParameters = false;   // parameters without a gradient contribute their .grad
};

class Reducer {
 public:
  // `params` (with `names` for messages) in registration order; every rank passes the same
  // list (the caller checks). Registers the autograd hooks. The hook must not be null.
  Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<comm::Group> group, ReducerOptions options,
          std::shared_ptr<CommHook> hook);
  // Waits for communication still in flight (it owns the bucket buffers); errors are dropped.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // false: backward only accumulates into .grad (noSync). Between iterations only.
  void setSync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  // Ends a synchronized iteration: hands the buckets not started yet (unused parameters,
  // overlap off) to the hook, waits for every bucket and runs the hook's finish(), in bucket
  // order. Blocking, bounded by the hook's collectives (the group's timeout). Throws the first
  // failure unchanged (the hook's or its collective's TimeoutError / PeerError / ...; a failure
  // of communication wins over "parameter got no gradient", which it may have caused);
  // InvalidArgument naming a parameter without a gradient when findUnusedParameters is off.
  // After a throw the reducer is ready for the next iteration. No-op under noSync.
  void finish();

  // After backward threw (an autograd hook's error, or the user's): waits for whatever was
  // started and resets the iteration. Returns the error to report: the first communication
  // failure of the iteration if there was one (the likely root cause), else `caught`.
  std::exception_ptr abandonIteration(std::exception_ptr caught) noexcept;

  // Parameter indices per bucket, in launch order.
  std::vector<std::vector<size_t>> bucketLayout() const;
  // Builds the buckets in `order` (every parameter index once, in launch order) and skips the
  // rebuild after the first iteration: a resumed job takes the layout the job that saved it had
  // (its hook encodes bucket by bucket). Every rank passes the same order. Between iterations
  // only. InvalidArgument unless `order` is a permutation of the parameters.
  void adoptOrder(const std::vector<size_t>& order);
  // The flat buffer of bucket b (the .grad views point into it).
  const torch::Tensor& bucketBuffer(size_t b) const { return buckets_.at(b).buffer; }
  const CommHook& hook() const { return *hook_; }
  CommHook& hook() { return *hook_; }

  // Synchronized iterations finished, and the time finish() took in them (starting the last
  // buckets, waiting for all, the hook's finish()).
  struct Stats {
    int64_t steps = 0;
    double finishSeconds = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Bucket : GradBucket {
    size_t pending = 0;  // parameters still without their gradient this iteration
    std::shared_ptr<comm::Work> work;
    bool started = false;
    // The timeline (SHOAL_TRACE): when its last gradient arrived and when it was launched, on
    // the group's trace sink's clock; 0 when not tracing.
    int64_t readyNs = 0;
    int64_t launchedNs = 0;
  };

  void buildBuckets(const std::vector<size_t>& order);
  void pointGradAtView(size_t param);
  void beforeAccumulate(size_t param);
  void afterAccumulate(size_t param);
  void markReady(size_t param);
  void startReadyBuckets();
  // One more of the bucket's parameters has its gradient; true when it was the last (the
  // bucket's ready time is noted for the timeline).
  bool settle(Bucket& b);
  // The bucket's span, ready -> done, with how long it waited to be launched (in order).
  void traceBucket(const Bucket& b) const;
  void rebuildFromReadyOrder();
  // Waits for every started bucket (ignoring errors) and returns the first one's error.
  std::exception_ptr drain() noexcept;
  void resetIteration();

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::Group> group_;
  ReducerOptions options_;
  std::shared_ptr<CommHook> hook_;
  // Held so that the nodes, and the hooks on them, survive between iterations (a parameter's
  // AccumulateGrad node is otherwise re-created by each forward, without our hooks).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> postHookKeys_;

  std::vector<Bucket> buckets_;
  std::vector<torch::Tensor> views_;  // per parameter: its slot of its bucket, shaped like it
  std::vector<size_t> bucketOf_;      // parameter -> bucket
  std::vector<char> ready_;           // per parameter, this iteration
  std::vector<size_t> readyOrder_;    // the first iteration's order, for the rebuild
  size_t nextToStart_ = 0;
  uint64_t layoutVersion_ = 0;
  bool sync_ = true;
  bool rebuilt_ = false;
  std::exception_ptr hookFailure_;  // what an autograd hook threw this iteration
  Stats stats_;
  std::shared_ptr<bool> alive_;  // the autograd hooks hold it weakly
};

}  // namespace shoal::train::ddp
