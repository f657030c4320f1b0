// Strategy::kDdp: DistributedDataParallel, a libtorch optimizer over the replica, sharded
// checkpoints (train/ddp_checkpoint.h) that reload at any world size and into any ZeRO stage.
// Under autotune, the bucket size and overlap are chosen over the first steps
// (comm/autotuner.h), each candidate a DistributedDataParallel rebuilt over the same module.
#include <fmt/format.h>

#include "comm/autotuner.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/ddp_checkpoint.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class DdpStrategy final : public DistributionStrategy {
 public:
  explicit DdpStrategy(const StrategyInputs& in)
      : module_(in.module), workers_(in.workers), optimizerOptions_(in.options.optimizer) {
    base_.bucketBytes = in.options.bucketBytes;
    base_.overlap = in.options.overlap;
    if (in.options.compression.enabled()) {
      base_.commHook = ddp::compressionHook(in.options.compression);
    }
    if (in.options.autotune) {
      std::vector<std::string> labels;
      for (size_t mib : {1, 4, 25}) {
        for (bool overlap : {true, false}) {
          candidates_.push_back({mib << 20, overlap});
          labels.push_back(fmt::format("bucket={}MiB overlap={}", mib, overlap ? "on" : "off"));
        }
      }
      tuner_.emplace(workers_, std::move(labels));
      apply(tuner_->current());
    } else {
      ddp_ = std::make_unique<DistributedDataParallel>(module_, workers_, base_);
    }
    optimizer_ = makeOptimizer(module_->parameters(), optimizerOptions_);
  }

  void beforeForward() override { ddp_->beforeForward(); }

  void backward(const torch::Tensor& loss, bool sync) override {
    if (sync) return ddp_->backward(loss);
    auto local = ddp_->noSync();
    ddp_->backward(loss);
  }

  void step(int64_t, double lr, double clipNorm) override {
    // The gradients are already the average over ranks: the same norm, the same clip, on every
    // rank.
    if (clipNorm > 0) torch::nn::utils::clip_grad_norm_(module_->parameters(), clipNorm);
    setLearningRate(*optimizer_, lr);
    optimizer_->step();
    optimizer_->zero_grad();
  }

  void save(const std::string& dir, const Progress& progress, int keep) override {
    saveDdpShards(ddp_->group(), dir, *module_, *optimizer_, optimizerOptions_, progress, keep);
  }

  std::optional<Progress> load(const std::string& dir) override {
    return loadDdpShards(ddp_->group(), dir, *module_, *optimizer_, optimizerOptions_);
  }

  CommunicationTotals communication() const override {
    const auto s = ddp_->stats();
    return {previous_.bytesSent + s.bytesSent, previous_.steps + s.steps};
  }
  double commWaitSeconds() const override { return previousWait_ + ddp_->stats().finishSeconds; }

  std::optional<Choice> noteStepTime(double seconds) override {
    if (!tuner_ || !tuner_->record(seconds)) {
      // Mid-search: the next trial's candidate, from the next step on.
      if (tuner_ && !tuner_->done() && tuner_->current() != applied_) apply(tuner_->current());
      return std::nullopt;
    }
    if (tuner_->best() != applied_) apply(tuner_->best());
    return Choice{static_cast<int>(tuner_->best()), tuner_->describe()};
  }

 private:
  struct Candidate {
    size_t bucketBytes;
    bool overlap;
  };

  // A DistributedDataParallel for candidate c (collective: every rank switches at the same
  // step, as the autotuner's trials end at the same step everywhere). The old one goes first:
  // its hooks on the parameters must not fire for the new one's backward.
  void apply(size_t c) {
    if (ddp_) {
      const auto s = ddp_->stats();
      previous_.bytesSent += s.bytesSent;
      previous_.steps += s.steps;
      previousWait_ += s.finishSeconds;
      ddp_.reset();
    }
    DdpOptions o = base_;
    o.bucketBytes = candidates_[c].bucketBytes;
    o.overlap = candidates_[c].overlap;
    ddp_ = std::make_unique<DistributedDataParallel>(module_, workers_, o);
    applied_ = c;
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::Group> workers_;
  OptimizerOptions optimizerOptions_;
  DdpOptions base_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<Candidate> candidates_;  // autotune's
  std::optional<comm::Autotuner> tuner_;
  size_t applied_ = 0;
  CommunicationTotals previous_;  // of the DistributedDataParallels replaced
  double previousWait_ = 0;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeDdpStrategy(const StrategyInputs& in) {
  return std::make_unique<DdpStrategy>(in);
}

}  // namespace shoal::train
