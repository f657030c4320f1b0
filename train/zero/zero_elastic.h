// Elastic ZeRO (stages 1-2): the keeper (train/elastic_keeper.h) that lets a ZeRO job lose a
// worker and go on, although each rank holds only a shard of the optimizer state.
//
//   zero::ElasticZero keeper(model, zeroOptions);
//   train::ElasticState state(*world.elastic, world.group, keeper);
//   state.run([&](comm::Group& group) {
//     auto& zero = keeper.zero();           // this view's ZeroDataParallel, state loaded
//     for (auto p = state.progress(); p.step < steps;) {
//       ... zero.backward(loss); zero.step(); p = p.after(...);
//       state.commit(p);
//     }
//   });
//
// How (Note [Elastic shards] in zero_elastic.cpp):
// - At each commit every rank copies its shard (master parameters, optimizer state, buffers,
//   named by parameter as sharded checkpoints name them) and sends the copy to the next rank of
//   the view, which keeps it: each shard lives on two ranks. Both the last and the previous
//   commit are kept (a rank may have committed a step its peers did not finish).
// - At a view change every rank sends what it holds to all (the survivors' shards and copies;
//   a joiner holds nothing), and all take the newest step whose pieces cover the whole model,
//   then build the new view's ZeroDataParallel and load their new shards from it. The world
//   size may change: the pieces name whole parameters, whatever the old layout was.
// - When no step is covered (two neighbouring ranks of the view died together), every rank
//   fails with InvalidArgument saying so: resume from a sharded checkpoint (ZeroDataParallel::
//   save/load) with `shoal run --max-restarts`.
//
// Costs: memory for four copies of a shard (this rank's and the previous rank's, at the last
// two commits), and each commit sends one shard to the next rank. A view change holds, for a
// moment, the whole state on every rank.
//
// Stage 3 is not elastic: its parameters live only in the shards, and a new ZeroDataParallel
// is built from the module's full parameters (InvalidArgument). The learning rate is the
// options' at each new view, times ElasticOptions::lrScaling's factor; a schedule sets its own
// at each step.
// A stateful stage-1 communication hook (ZeroOptions::commHook with error feedback, PowerSGD) is
// shared by every view's ZeroDataParallel; its state is part of each commit
// (train/elastic_hook_state.h): after a change every rank that committed the step the job
// continues from gets its own state of that step back, and a joiner the holders' mean. The
// failed rank's residuals are lost with it, so such a job is not bit for bit one resumed from
// a sharded checkpoint of the same step (whose residuals are the mean over all ranks).
//
// Threads: one thread (ElasticState's). The module must outlive this object.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "train/elastic_hook_state.h"
#include "train/elastic_keeper.h"
#include "train/zero/zero.h"

namespace shoal::train::zero {

class ElasticZero : public ElasticKeeper {
 public:
  ElasticZero(std::shared_ptr<torch::nn::Module> module, ZeroOptions options);
  ~ElasticZero() override;

  // The current view's ZeroDataParallel (built by enter()). InvalidArgument outside a view.
  ZeroDataParallel& zero();

  void enter(comm::Group& group, const comm::View& view) override;
  void commit(comm::Group& group, const ElasticProgress& progress) override;
  void leave() override;
  const ElasticProgress& committed() const override { return current_.progress; }
  void scaleLr(double factor) override;
  bool whole() const override { return false; }
  std::string encode() const override;
  void decode(const std::string& bytes, const std::string& what) override;

 private:
  // What this rank holds of one commit: its own shard and the previous rank's copy, each
  // encoded (zero_elastic.cpp); step -1: nothing.
  struct Held {
    ElasticProgress progress{-1, 0, 0};
    std::string own, kept;
  };
  // The two-rank groups a commit sends this rank's shard on and receives the previous rank's
  // on (more than two ranks; with two, the view's group itself). zero_elastic.cpp.
  struct Ring {
    std::shared_ptr<comm::Group> toNext, fromPrev;
    void build(comm::Group& group);
  };
  void recover(comm::Group& group);
  std::string passAlong(comm::Group& group, const std::string& mine);

  Ring ring_;

  std::shared_ptr<torch::nn::Module> module_;
  ZeroOptions options_;
  std::unique_ptr<ZeroDataParallel> zero_;
  Held current_, previous_;
  ElasticHookState hookState_;  // options_.commHook's, at the same commits
};

}  // namespace shoal::train::zero
