// Strategy::kParameterServer: the servers (the world's last numServers ranks) hold the
// parameters and the optimizer state, apply the updates on their schedule and write their own
// checkpoints; this worker pushes its gradients and pulls the parameters (train/ps_trainer.h).
#include "common/error.h"
#include "train/ps_trainer.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class PsStrategy final : public DistributionStrategy {
 public:
  explicit PsStrategy(const StrategyInputs& in) : module_(in.module) {
    const TrainerOptions& o = in.options;
    ps::TrainingConfig config;
    config.mode = o.psMode;
    config.staleness = o.staleness;
    config.optimizer = o.optimizer;
    config.warmupSteps = o.warmupSteps;
    config.linearScaling = o.linearScaling;
    config.totalSteps = o.cosineDecay ? in.totalSteps : 0;
    ps::ClientOptions client = o.psClient;
    client.replicas = in.ctx.psReplicas;
    // Error-feedback residuals are saved beside the servers' checkpoints (ps/client.h).
    client.checkpointDir = o.checkpointDir;
    client.checkpointEvery = o.checkpointEvery;
    client.keep = o.keep;
    trainer_ = std::make_unique<PsTrainer>(*in.ctx.world, in.workers->rank(), in.workers->size(),
                                           in.ctx.numServers, *module_, config, client);
  }

  // Gradients accumulate in .grad until the step pushes them.
  void backward(const torch::Tensor& loss, bool) override { loss.backward(); }

  // Clipping is of this worker's own gradients (the servers average them).
  void step(int64_t step, double, double clipNorm) override {
    if (clipNorm > 0) torch::nn::utils::clip_grad_norm_(module_->parameters(), clipNorm);
    trainer_->step(step);
    module_->zero_grad();
  }

  void save(const std::string&, const Progress&, int) override {}
  std::optional<Progress> load(const std::string&) override { return std::nullopt; }
  std::optional<int64_t> serverStep() const override { return trainer_->startStep(); }
  // Goodbye to the servers: they end when every worker said it.
  void finish() override { trainer_->finish(); }
  void beforeValidation(int64_t step) override { trainer_->refresh(step); }
  CommunicationTotals communication() const override {
    const ps::Traffic t = trainer_->traffic();
    return {t.pushedBytes, static_cast<int64_t>(t.pushes)};
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<PsTrainer> trainer_;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makePsStrategy(const StrategyInputs& in) {
  SHOAL_CHECK(in.ctx.numServers > 0,
              "strategy ps needs parameter servers: start the job with shoal run -n N --servers K "
              "(or set SHOAL_NUM_SERVERS)");
  return std::make_unique<PsStrategy>(in);
}

}  // namespace shoal::train
