// Strategy::kPipeline, kTensor, kHybrid: the model split over the Trainer's process grid by
// HybridParallel (train/hybrid_parallel.h): cut into pipeline stages, its tensor-parallel
// layers sliced, replicated over the rest. Each rank's optimizer steps its own part; clipping
// takes the whole model's norm (train/grid_grad_norm.h); checkpoints are one shard per stage and
// slice (train/sharded_checkpoint.h), resumable on the same grid.
#include <fmt/format.h>

#include <iostream>

#include "common/error.h"
#include "train/grid_grad_norm.h"
#include "train/hybrid_parallel.h"
#include "train/pipeline/stage_checkpoint.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class HybridStrategy final : public DistributionStrategy {
 public:
  explicit HybridStrategy(const StrategyInputs& in)
      : grid_(*in.grid),
        optimizerOptions_(in.options.optimizer),
        keep_(in.options.keep),
        advise_(in.options.pipeline.printPlan) {
    SHOAL_CHECK(in.sequential, "strategy {} needs the model as a torch::nn::Sequential",
                toString(in.options.strategy));
    HybridOptions o;
    o.pipeline = in.options.pipeline;
    o.pipeline.ddp.bucketBytes = in.options.bucketBytes;
    o.ddp.bucketBytes = in.options.bucketBytes;
    o.precision = in.options.precision;
    resumeWithSavedSplit(in, o.pipeline);
    model_ = std::make_unique<HybridParallel>(*in.sequential, grid_, in.sampleInputs, in.loss, o);
    optimizer_ = makeOptimizer(model_->parameters(), optimizerOptions_);
  }

  bool ownsStep() const override { return true; }

  // A time-balanced split is measured anew by each run (a loaded machine measures another cut),
  // while checkpoints resume only on the split that wrote them: resuming takes that split.
  static void resumeWithSavedSplit(const StrategyInputs& in, pipeline::PipelineOptions& p) {
    const TrainerOptions& o = in.options;
    if (!o.resume || o.checkpointDir.empty() || o.pipelineStages < 2 ||
        p.split != pipeline::SplitMethod::kTime) {
      return;
    }
    auto saved =
        pipeline::savedBoundaries(*in.workers, o.checkpointDir, o.pipelineStages, p.chunks);
    if (!saved) return;
    p.split = pipeline::SplitMethod::kBoundaries;
    p.boundaries = *saved;
    if (in.workers->rank() == 0 && p.printPlan) {
      std::cout << fmt::format("resume: the split the checkpoints in {} were written with\n",
                               o.checkpointDir)
                << std::flush;
    }
  }

  // The measured stage times and a better split, if any, on world rank 0 (with the plan). None
  // when fit() ran no step (a finished job resumed): nothing was measured.
  void finish() override {
    auto* pipe = model_->pipeline();
    if (!pipe || !advise_ || !stepped_) return;
    const pipeline::SplitAdvice advice = pipe->splitAdvice();
    if (grid_.world->rank() == 0) std::cout << advice.describe() << std::flush;
  }

  double trainStep(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    stepped_ = true;
    return model_->step(inputs, targets);
  }

  void backward(const torch::Tensor&, bool) override {
    SHOAL_THROW(InternalError, "the grid strategies run their backward in trainStep");
  }

  void step(int64_t, double lr, double clipNorm) override {
    if (clipNorm > 0) clipGridGradNorm(model_->localModule(), grid_, clipNorm);
    setLearningRate(*optimizer_, lr);
    model_->optimizerStep(*optimizer_);  // with fp16: skipped on every rank after an overflow
    optimizer_->zero_grad();
  }

  HybridParallel* hybrid() override { return model_.get(); }

  std::array<double, 3> evaluate(const torch::Tensor& inputs, const torch::Tensor& targets,
                                 bool classes) override {
    return model_->evaluateShare(inputs, targets, classes);
  }

  void save(const std::string& dir, const Progress& progress, int) override {
    checkpointer(dir).save(*optimizer_, progress);
  }

  std::optional<Progress> load(const std::string& dir) override {
    return checkpointer(dir).resumeLatest(*optimizer_);
  }

 private:
  ShardedCheckpointer& checkpointer(const std::string& dir) {
    if (!checkpointer_ || dir != checkpointDir_) {
      checkpointer_ = model_->checkpointer(dir, keep_);
      checkpointDir_ = dir;
    }
    return *checkpointer_;
  }

  const ProcessGrid& grid_;
  OptimizerOptions optimizerOptions_;
  int keep_;
  bool advise_;
  bool stepped_ = false;
  std::unique_ptr<HybridParallel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ShardedCheckpointer> checkpointer_;
  std::string checkpointDir_;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeHybridStrategy(const StrategyInputs& in) {
  return std::make_unique<HybridStrategy>(in);
}

}  // namespace shoal::train
