// Strategy::kPipeline, kTensor, kHybrid: the model split over the Trainer's process grid by
// HybridParallel (train/hybrid_parallel.h): cut into pipeline stages, its tensor-parallel
// layers sliced, replicated over the rest. Each rank's optimizer steps its own part; clipping
// takes the whole model's norm (train/grid_grad_norm.h); checkpoints are one shard per stage and
// slice (train/sharded_checkpoint.h), resumable on the same grid.
#include <iostream>

#include "common/error.h"
#include "train/grid_grad_norm.h"
#include "train/hybrid_parallel.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class HybridStrategy final : public DistributionStrategy {
 public:
  explicit HybridStrategy(const StrategyInputs& in)
      : grid_(*in.grid),
        loss_(in.loss),
        optimizerOptions_(in.options.optimizer),
        keep_(in.options.keep),
        advise_(in.options.pipeline.printPlan && in.options.pipeline.chunks == 1) {
    SHOAL_CHECK(in.sequential, "strategy {} needs the model as a torch::nn::Sequential",
                toString(in.options.strategy));
    HybridOptions o;
    o.pipeline = in.options.pipeline;
    o.pipeline.ddp.bucketBytes = in.options.bucketBytes;
    o.ddp.bucketBytes = in.options.bucketBytes;
    o.precision = in.options.precision;
    precision_ = in.options.precision;
    microBatches_ = grid_.pipelineSize > 1 ? in.options.pipeline.microBatches : 1;
    sequential_ = *in.sequential;
    model_ = std::make_unique<HybridParallel>(sequential_, grid_, in.sampleInputs, loss_, o);
    optimizer_ = makeOptimizer(model_->parameters(), optimizerOptions_);
  }

  bool ownsStep() const override { return true; }

  // The measured stage times and a better split, if any, on world rank 0 (with the plan).
  void finish() override {
    auto* pipe = model_->pipeline();
    if (!pipe || !advise_) return;
    const pipeline::SplitAdvice advice = pipe->splitAdvice();
    if (grid_.world->rank() == 0) std::cout << advice.describe() << std::flush;
  }

  double trainStep(const torch::Tensor& inputs, const torch::Tensor& targets) override {
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

  std::array<double, 3> evaluate(const torch::Tensor& inputs, const torch::Tensor& targets,
                                 bool classes) override {
    // This replica's rows of the chunk (near-equal shares; a replica may get none).
    const int64_t n = inputs.size(0);
    const int64_t begin = n * grid_.dataRank / grid_.dataSize;
    const int64_t rows = n * (grid_.dataRank + 1) / grid_.dataSize - begin;
    if (rows == 0) return {0, 0, 0};  // on every stage of this replica alike
    torch::Tensor x = inputs.narrow(0, begin, rows), y = targets.narrow(0, begin, rows);
    torch::NoGradGuard noGrad;
    AutocastGuard autocast(precision_);
    torch::Tensor out;
    if (auto* pipe = model_->pipeline()) {
      // The pipeline cuts the batch into its micro-batches: a short tail is padded with copies
      // of its last row, whose outputs are dropped.
      if (rows < microBatches_) {
        std::vector<int64_t> tail = x.sizes().vec();
        tail[0] = microBatches_ - rows;
        x = torch::cat({x, x.narrow(0, rows - 1, 1).expand(tail)});
      }
      out = pipe->predict(x);
      if (out.defined()) out = out.narrow(0, 0, rows);
    } else {
      out = sequential_->forward(x);
    }
    if (!out.defined()) return {0, 0, 0};  // not the last stage
    // Every tensor rank of the last stage computes the loss (it may be collective over them:
    // a vocabulary-parallel loss); tensor rank 0 counts it.
    const double loss = loss_(out, y).item<double>();
    if (grid_.tensorRank != 0) return {0, 0, 0};
    const double correct =
        classes ? static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>()) : 0;
    return {loss * static_cast<double>(rows), correct, static_cast<double>(rows)};
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
  LossFn loss_;
  OptimizerOptions optimizerOptions_;
  int keep_;
  bool advise_;
  torch::nn::Sequential sequential_{nullptr};
  Precision precision_ = Precision::kFloat32;
  int64_t microBatches_ = 1;
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
