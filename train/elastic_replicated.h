// The state of an elastic data-parallel job whose ranks all hold all of it (DDP): a model and
// its optimizer, copied into memory at each commit and put back after a failure. After a view
// change the most advanced member's copy (comm::View::source) is broadcast to the others (the
// survivors that missed the last step, and joiners). A stateful communication hook's state
// goes with each commit too (train/elastic_hook_state.h: each rank's own, a joiner the mean), and
// so does an fp16 loss scaler's (the source's, like the model's: every rank must scale alike).
//
// Threads and errors: as train/elastic_keeper.h. The model and optimizer must outlive it.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/elastic_hook_state.h"
#include "train/elastic_keeper.h"
#include "train/mixed_precision.h"
#include "train/optimizer_state.h"

namespace shoal::train {

class ReplicatedState : public ElasticKeeper {
 public:
  // `hook`: the communication hook every view's DDP uses (null: none, or one that keeps no
  // state). `scaler`: the loop's loss scaler (null: none); it must outlive this object.
  ReplicatedState(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                  std::shared_ptr<ddp::CommHook> hook = nullptr, LossScaler* scaler = nullptr);

  void enter(comm::Group& group, const comm::View& view) override;
  void commit(comm::Group& group, const ElasticProgress& progress) override;
  void leave() override;
  const ElasticProgress& committed() const override { return snapshot_.progress; }
  void scaleLr(double factor) override;
  bool whole() const override { return true; }
  std::string encode() const override;
  void decode(const std::string& bytes, const std::string& what) override;

  // Puts the live model and optimizer back to the snapshot.
  void restore();

 private:
  struct Snapshot {
    ElasticProgress progress;
    std::vector<torch::Tensor> model;  // parameters, then buffers
    std::vector<std::optional<ParamState>> optimizer;
    std::optional<LossScalerState> scaler;
  };
  void take(const ElasticProgress& progress);
  void sync(comm::Group& group, const comm::View& view);
  std::vector<torch::Tensor> modelTensors() const;

  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  LossScaler* scaler_;
  Snapshot snapshot_;
  bool taken_ = false;
  std::vector<double> baseLr_;  // each parameter group's lr at construction
  ElasticHookState hookState_;
};

}  // namespace shoal::train
