// Strategy::kZero1-3: ZeroDataParallel (train/zero/zero.h), which shards the optimizer state
// (1), the gradients (2) and the parameters (3), steps its own optimizer over the shards, clips
// over every shard, and writes sharded checkpoints that reload at any world size.
#include "common/error.h"
#include "train/ddp/compression_hook.h"
#include "train/trainer/distribution_strategy.h"
#include "train/zero/zero.h"

namespace shoal::train {

namespace {

class ZeroStrategy final : public DistributionStrategy {
 public:
  explicit ZeroStrategy(const StrategyInputs& in) {
    zero::ZeroOptions o;
    o.stage = in.options.strategy == Strategy::kZero1   ? 1
              : in.options.strategy == Strategy::kZero2 ? 2
                                                        : 3;
    o.bucketBytes = in.options.bucketBytes;
    o.optimizer = in.options.optimizer;
    o.clipNorm = in.options.clipNorm;
    if (in.options.compression.enabled()) {
      o.commHook = ddp::compressionHook(in.options.compression);  // stage 1 (validated)
    }
    if (in.sequential) {
      zero_ = std::make_unique<zero::ZeroDataParallel>(*in.sequential, in.workers, o);
      ownsForward_ = true;
    } else {
      SHOAL_CHECK(o.stage < 3,
                  "strategy zero3 shards the parameters unit by unit and needs the model as a "
                  "torch::nn::Sequential (the Trainer's Sequential constructor)");
      zero_ = std::make_unique<zero::ZeroDataParallel>(in.module, in.workers, o);
    }
  }

  void beforeForward() override { zero_->beforeForward(); }
  bool ownsForward() const override { return ownsForward_; }
  torch::Tensor forward(const torch::Tensor& input) override { return zero_->forward(input); }

  void backward(const torch::Tensor& loss, bool sync) override {
    if (sync) return zero_->backward(loss);
    auto local = zero_->noSync();
    zero_->backward(loss);
  }

  // Clipping is ZeroOptions::clipNorm (the norm summed over every shard), set at construction.
  void step(int64_t, double lr, double) override {
    zero_->setLearningRate(lr);
    zero_->step();
  }

  void save(const std::string& dir, const Progress& progress, int keep) override {
    zero_->save(dir, progress, keep);
  }
  std::optional<Progress> load(const std::string& dir) override { return zero_->load(dir); }

 private:
  std::unique_ptr<zero::ZeroDataParallel> zero_;
  bool ownsForward_ = false;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeZeroStrategy(const StrategyInputs& in) {
  return std::make_unique<ZeroStrategy>(in);
}

}  // namespace shoal::train
