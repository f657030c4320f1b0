// Strategy::kZero1-3: ZeroDataParallel (train/zero/zero.h), which shards the optimizer state
// (1), the gradients (2) and the parameters (3), steps its own optimizer over the shards, clips
// over every shard, and writes sharded checkpoints that reload at any world size. In an elastic
// job (stages 1-2) the ZeroDataParallel is each view's, built by zero::ElasticZero
// (train/zero/zero_elastic.h), which keeps the shards through the view changes.
#include "common/error.h"
#include "train/ddp/compression_hook.h"
#include "train/trainer/distribution_strategy.h"
#include "train/zero/zero.h"
#include "train/zero/zero_elastic.h"

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
    if (in.ctx.elastic) {
      keeper_ = std::make_unique<zero::ElasticZero>(in.module, o);  // views build theirs
    } else if (in.sequential) {
      owned_ = std::make_unique<zero::ZeroDataParallel>(*in.sequential, in.workers, o);
      ownsForward_ = true;
    } else {
      SHOAL_CHECK(o.stage < 3,
                  "strategy zero3 shards the parameters unit by unit and needs the model as a "
                  "torch::nn::Sequential (the Trainer's Sequential constructor)");
      owned_ = std::make_unique<zero::ZeroDataParallel>(in.module, in.workers, o);
    }
    zero_ = owned_.get();
  }

  // The keeper carries the compression hook's state itself (ZeroOptions::commHook).
  std::unique_ptr<ElasticState> makeElastic(const comm::ElasticContext& context,
                                            std::shared_ptr<comm::Group> group,
                                            ElasticOptions options) override {
    SHOAL_CHECK(keeper_ != nullptr, "ZeroStrategy: not made for an elastic job");
    return std::make_unique<ElasticState>(context, std::move(group), *keeper_, std::move(options));
  }
  void enterView(std::shared_ptr<comm::Group>) override { zero_ = &keeper_->zero(); }
  void leaveView() override { zero_ = nullptr; }

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
  std::unique_ptr<zero::ZeroDataParallel> owned_;  // a fixed world's
  std::unique_ptr<zero::ElasticZero> keeper_;      // an elastic job's
  zero::ZeroDataParallel* zero_ = nullptr;         // the one in use (an elastic view's)
  bool ownsForward_ = false;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeZeroStrategy(const StrategyInputs& in) {
  return std::make_unique<ZeroStrategy>(in);
}

}  // namespace shoal::train
