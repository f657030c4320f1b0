// A communication hook's state (ddp::HookState: error-feedback residuals, momentum correction's
// velocities, PowerSGD's Q, the warm-up's step count) carried through an elastic job's view
// changes, beside the model and optimizer state its keeper carries (train/elastic_keeper.h).
//
//   ElasticHookState hookState(hook, model, BucketsBuilt::kBeforeRestore);
//   ... at each commit:          hookState.take(progress.step);
//   ... at a view change:        hookState.restore(group, continuedStep);
//
// Why: a hook's state changes inside a step (top-k updates its residual as it encodes, before
// its all-gather). A job that continues from its last commit with the hook as the failed step
// left it would send that step's held-back gradients on top of the same samples' gradients
// again. A joiner's new hook would also be out of step with the others: another warm-up count
// (its plain all-reduce meets their all-gather, and the job fails) and PowerSGD's starting Q
// instead of the running one.
//
// What restore() gives each rank, for the step the job continues from:
// - a rank that committed that step: its own state as of that commit, exactly;
// - a rank that did not (a joiner, or a survivor that had not reached it): the mean of the
//   holders' per-rank tensors (HookState::Tensor::perRank), the holders' shared ones and their
//   step count. The ranks' held-back gradients enter the average update as their mean, which
//   this keeps, as a checkpoint loaded at another world size does (train/hook_checkpoint.h).
// A failed rank's own residuals are lost with it: what it held back is never sent. So a job
// that lost a rank is not bit for bit one resumed from a checkpoint of the same step (whose
// residuals are the mean over every rank that saved them).
//
// Costs: the last two commits' states in memory, and a copy of the state at each commit. A view
// change costs one small all-gather; when some rank holds no state of its own, also a broadcast
// of the state's layout and one all-reduce as large as the state.
//
// Threads: the training thread, between steps. restore() is collective over `group`, bounded
// by its deadlines; a state that does not fit the hook (InvalidArgument) fails on every rank
// (train/collective_verdict.h). A hook that is null or keeps no state makes both no-ops.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/group.h"
#include "train/ddp/comm_hook.h"

namespace shoal::train {

// When the hook's users make its buckets (CommHook::makeState), relative to restore():
// - kBeforeRestore: before it (ZeRO: ElasticZero builds the view's ZeroDataParallel first), so
//   the state goes into them;
// - kAfterRestore: after it (DDP, built inside each view's function), so restore() first gives
//   the hook a bucket of its own for every trainable parameter (a joiner's new hook has none),
//   and DDP's buckets take the state over from those as after any rebuild of its layout.
enum class BucketsBuilt { kBeforeRestore, kAfterRestore };

class ElasticHookState {
 public:
  // `module`: the model the hook's state is of (its trainable parameters in order are the
  // hook's parameter indices; their sizes bound what a peer's layout may claim).
  ElasticHookState(std::shared_ptr<ddp::CommHook> hook, const torch::nn::Module& module,
                   BucketsBuilt buckets);

  // Keeps a copy of the hook's state as the state of `step` (the last two steps are kept; a
  // second take() of the same step replaces the first).
  void take(int64_t step);

  // Sets the hook's state on every rank of `group` to the state at `step` (above), and forgets
  // copies of later steps (another history now). Collective.
  void restore(comm::Group& group, int64_t step);

 private:
  struct Copy {
    int64_t step = -1;
    ddp::HookState state;
  };
  void makeParameterBuckets(comm::Group& group);
  // For the ranks without a copy of the step: the holders' mean (collective).
  ddp::HookState holdersMean(comm::Group& group, const Copy* own, int source,
                             int64_t holders) const;

  std::shared_ptr<ddp::CommHook> hook_;  // null when it keeps no state
  std::vector<torch::Tensor> params_;    // the trainable parameters, in the hook's order
  BucketsBuilt buckets_;
  int64_t maxElements_ = 0;
  Copy last_, before_;
};

}  // namespace shoal::train
