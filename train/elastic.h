// Elastic data-parallel training: when a worker dies or stalls the survivors agree on a new view
// without it and go on from the state they hold in memory, and new workers are admitted at a
// step boundary, all without a restart (in the spirit of Horovod's hvd.elastic.run).
//
//   auto world = shoal::init();  // shoal run --elastic 2:4 -n 4 -- program
//   train::ElasticState state(*world.elastic, world.group, *model, *optimizer);
//   state.run([&](comm::Group& group) {
//     train::DistributedDataParallel ddp(model, group.shared_from_this());
//     for (auto p = state.progress(); p.step < steps;) {
//       auto s = sampler.step(p.epoch, p.position, group.rank(), group.size(), batch);
//       ... loss summed over s.indices, times group.size() / s.total; ddp.backward; step ...
//       p = p.after(s.nextPosition, sampler.size());
//       state.commit(p);
//     }
//   });
//
// The contract:
// - commit(p) is the step boundary: it copies the model's parameters and buffers, the
//   optimizer's state and the progress into this rank's snapshot (memory, no disk; what is
//   copied is the keeper's, train/elastic_keeper.h), and every
//   `admitEvery` commits asks the store (rank 0, then one broadcast) whether workers wait to
//   join.
// - A PeerError or TimeoutError out of the function (a peer died, stalled, or left) ends this
//   view: every rank restores its snapshot, the survivors agree on the next view (see
//   comm/membership.h), form its group, and the function runs again with it. Survivors that
//   committed different steps (a peer died inside the last step's all-reduce after some ranks
//   got its result) all continue from the most advanced one, whose state is broadcast; so do
//   joiners. The function must start from progress(), not from its own counters. (With a
//   sharded keeper, train/zero/zero_elastic.h, the survivors continue from the newest step whose
//   shards they still hold between them.)
// - Joiners: at a commit where workers wait, every rank leaves the function (run() catches it),
//   the new view has them, they receive the state, and the function runs again.
// - Other exceptions (the user's, InvalidArgument, MismatchError, ...) leave run() unchanged.
// - When `fn` returns, the job's training is over: a worker still waiting to be admitted
//   (in shoal::init()) gets comm::JobFinished at once instead of waiting out its timeout.
// - Below the minimum size for longer than the membership allows, run() writes the last
//   committed state to `checkpointPath` (when set; load() resumes from it) and throws the
//   membership's TimeoutError, with the checkpoint named.
//
// Threads: one thread drives run(), commit() and the function. Blocking calls are bounded by
// the group and membership deadlines.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/membership.h"
#include "train/ddp/comm_hook.h"
#include "train/elastic_keeper.h"
#include "train/mixed_precision.h"

namespace shoal::train {

// How the learning rate follows the world size (ElasticOptions::lrScaling).
enum class LrScaling {
  kNone,    // as set: a smaller world takes smaller global steps at the same rate
  kLinear,  // x size / reference: the linear scaling rule (the global batch grows with the world)
  kSqrt,    // x sqrt(size / reference): the rule often used with adaptive optimizers (Adam)
};

struct ElasticOptions {
  int64_t admitEvery = 1;      // commits between checks for joiners (>= 1)
  std::string checkpointPath;  // written when the job gives up below the minimum; empty: none
  // Every parameter group's lr becomes its lr at construction times the factor for the current
  // view's size, set when run() starts and at each view change, the same on every rank
  // (joiners too). An LR schedule that also writes the lr should scale itself instead (in
  // onViewChange) and leave this kNone.
  LrScaling lrScaling = LrScaling::kNone;
  int lrReferenceSize = 0;  // the size the optimizer's lr is for; 0: the launch's worker count
  // The communication hook every view's DistributedDataParallel is given (DdpOptions::commHook,
  // the same object each time): its state (compression's residuals, PowerSGD's Q, the warm-up
  // count) is kept at each commit and restored at a view change (train/elastic_hook_state.h).
  // Only with the model-and-optimizer constructor (zero::ElasticZero carries
  // ZeroOptions::commHook itself); nothing to set for a hook that keeps no state.
  std::shared_ptr<ddp::CommHook> commHook;
  // The loss scaler the loop uses with fp16 (train/mixed_precision.h), which must outlive the
  // ElasticState: its scale and counters are kept at each commit, put back after a failure, and
  // sent to the ranks that need the state (joiners), as the model is. Every rank must scale
  // alike: DDP averages the scaled gradients. Only with the model-and-optimizer constructor.
  LossScaler* lossScaler = nullptr;
};

struct ElasticStats {
  int viewChanges = 0;
  // The last change: from the failure (or the decision to admit) to the new group formed and
  // the state synchronized, in seconds; and how many committed steps were lost (the step this
  // rank had committed minus the step everyone continued from; always <= 0: no work lost
  // beyond the uncommitted step).
  double lastRecoverySeconds = 0;
  int64_t lastResumedStep = 0;
};

class ElasticState {
 public:
  // `group` is the current view's group (World::group). The model and optimizer must outlive
  // this object: every rank keeps all of their state (train/elastic_replicated.h).
  ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
               torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               ElasticOptions options = {});
  // The state is held by `keeper` (e.g. zero::ElasticZero: each rank a shard), which must
  // outlive this object. InvalidArgument for a checkpointPath when the keeper cannot write one
  // file (not whole()).
  ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
               ElasticKeeper& keeper, ElasticOptions options = {});

  // See the file comment. Returns when `fn` returns.
  void run(const std::function<void(comm::Group&)>& fn);

  // The step boundary (see the file comment). May throw what a collective throws, and leaves
  // `fn` to admit joiners.
  void commit(const ElasticProgress& progress);

  // The last committed progress.
  const ElasticProgress& progress() const { return keeper_->committed(); }
  const comm::View& view() const { return context_.membership->current(); }
  const std::shared_ptr<comm::Group>& group() const { return group_; }
  const ElasticStats& stats() const { return stats_; }

  // Whether the state has a one-file form (save(), load(), checkpointPath): a replicated state
  // does; a sharded one (zero::ElasticZero) does not.
  bool whole() const { return keeper_->whole(); }

  // The factor lrScaling applies to the construction-time lr at `size` workers (1 for kNone).
  double lrFactor(int size) const;

  // Called after each view change, before `fn` runs again: (old view, new view).
  std::function<void(const comm::View&, const comm::View&)> onViewChange;

  // Replaces the model's, the optimizer's state and the progress with those saved in `path`
  // (written when a job gave up), as the committed state. Before run(). InvalidArgument (one
  // line) when the file is not such a state or was saved from another model, or the keeper does
  // not hold the whole state.
  void load(const std::string& path);

  // Writes the last committed state to `path` in the form load() reads (a sealed file: whole or
  // absent, never torn). Local: any one rank may write it (every rank holds the same). Before
  // run() or between steps. InvalidArgument when the keeper does not hold the whole state;
  // SystemError when the write fails.
  void save(const std::string& path) const;

 private:
  ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
               std::unique_ptr<ElasticKeeper> owned, ElasticKeeper* keeper, ElasticOptions options);
  void reform(const std::vector<int>& failed);
  // InvalidArgument naming `path` when the keeper has no one-file form.
  void requireWhole(const std::string& path, const char* instead) const;
  void enter();
  void scaleLr();

  comm::ElasticContext context_;
  std::shared_ptr<comm::Group> group_;
  std::unique_ptr<ElasticKeeper> owned_;  // the replicated keeper of the model/optimizer form
  ElasticKeeper* keeper_;
  ElasticOptions options_;
  bool entered_ = false;
  int64_t commits_ = 0;
  ElasticStats stats_;
};

}  // namespace shoal::train
