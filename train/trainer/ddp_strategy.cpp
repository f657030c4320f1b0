// Strategy::kDdp: DistributedDataParallel, a libtorch optimizer over the replica, sharded
// checkpoints (train/ddp_checkpoint.h) that reload at any world size and into any ZeRO stage.
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/ddp_checkpoint.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class DdpStrategy final : public DistributionStrategy {
 public:
  explicit DdpStrategy(const StrategyInputs& in)
      : module_(in.module), optimizerOptions_(in.options.optimizer) {
    DdpOptions o;
    o.bucketBytes = in.options.bucketBytes;
    o.overlap = in.options.overlap;
    if (in.options.compression.enabled()) {
      o.commHook = ddp::compressionHook(in.options.compression);
    }
    ddp_ = std::make_unique<DistributedDataParallel>(module_, in.workers, o);
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

 private:
  std::shared_ptr<torch::nn::Module> module_;
  OptimizerOptions optimizerOptions_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeDdpStrategy(const StrategyInputs& in) {
  return std::make_unique<DdpStrategy>(in);
}

}  // namespace shoal::train
