// Private to the Trainer (train/trainer.h): what differs between the strategies, behind one
// interface, one implementation per file (ddp_strategy.cpp, zero_strategy.cpp, ps_strategy.cpp,
// hybrid_strategy.cpp). The Trainer owns the loop; a strategy owns the wrapper, the optimizer
// and the checkpoint format. Threading, blocking and errors: those of the wrapped class.
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "train/elastic.h"
#include "train/trainer.h"

namespace shoal::train {

class HybridParallel;  // train/hybrid_parallel.h

class DistributionStrategy {
 public:
  virtual ~DistributionStrategy() = default;

  // Before each micro-batch's forward (DDP, ZeRO: rank 0's buffers).
  virtual void beforeForward() {}
  // True when the strategy runs the forward itself (ZeRO-3 gathers each unit around it).
  virtual bool ownsForward() const { return false; }
  virtual torch::Tensor forward(const torch::Tensor& input);
  // backward of a micro-batch's (scaled) loss; sync false: accumulate locally only.
  virtual void backward(const torch::Tensor& loss, bool sync) = 0;
  // One optimizer step as step number `step` at rate lr (the parameter servers follow their
  // own schedule), gradients clipped to clipNorm (> 0) first, then cleared.
  virtual void step(int64_t step, double lr, double clipNorm) = 0;
  // Checkpoints; ps: nothing (the servers write theirs). load: nothing when dir has none.
  virtual void save(const std::string& dir, const Progress& progress, int keep) = 0;
  virtual std::optional<Progress> load(const std::string& dir) = 0;
  // ps: the step the servers are at (a resumed job continues there); others: nothing.
  virtual std::optional<int64_t> serverStep() const { return std::nullopt; }
  // After the last epoch of fit() (ps: the servers are told this worker is done).
  virtual void finish() {}
  // Before a validation (ps: the servers' current parameters, which asynchronous workers' own
  // copies lag behind).
  virtual void beforeValidation(int64_t /*step*/) {}
  // What the strategy sent so far, and the seconds it waited for communication at the ends of
  // steps (ddp's last buckets), both since construction.
  virtual CommunicationTotals communication() const { return {}; }
  virtual double commWaitSeconds() const { return 0; }
  // Note [Step-time breakdown] (train/trainer.h): the spans since `since` in which the training
  // thread waited for communication that another thread ran (ddp: its wait for the buckets at
  // the end of backward), appended to `out`.
  virtual void waitSpans(Clock::time_point /*since*/, std::vector<comm::TimeSpan>& /*out*/) const {}
  // Notes a finished step's wall time (ddp under autotune: its trials). Returns the autotuner's
  // choice on the step that made it.
  struct Choice {
    int index = -1;
    std::string description;
  };
  virtual std::optional<Choice> noteStepTime(double /*seconds*/) { return std::nullopt; }

  // The grid strategies (pipeline, tensor, hybrid) run a whole step's forward and backward
  // themselves, on the global batch every worker is given (each replica takes its share), under
  // their own precision. Returns the batch's mean loss, the same on every rank.
  virtual bool ownsStep() const { return false; }
  virtual double trainStep(const torch::Tensor& inputs, const torch::Tensor& targets);
  // Their validation of a chunk every worker is given: this rank's {loss x samples, correct,
  // samples}, non-zero only on the ranks that count its share (summed over the workers after).
  virtual std::array<double, 3> evaluate(const torch::Tensor& inputs, const torch::Tensor& targets,
                                         bool classes);
  // Their model on the grid (its pipeline, loss scaler, full-state gather); null for the others.
  virtual HybridParallel* hybrid() { return nullptr; }

  // Elastic jobs (train/trainer/elastic_fit.cpp). makeElastic: the job's ElasticState over
  // what this strategy keeps (ddp: the model, its optimizer and the compression hook's state;
  // zero1-2: zero::ElasticZero's shards), made once, before the first view, over its group.
  // enterView: from now on the strategy works over `group` (every view's, the first one's included;
  // a strategy made for an elastic job has no group before it). leaveView: it lets go of the view's
  // group (the view failed). The strategies that are not elastic throw InvalidArgument.
  virtual std::unique_ptr<ElasticState> makeElastic(const comm::ElasticContext& context,
                                                    std::shared_ptr<comm::Group> group,
                                                    ElasticOptions options);
  virtual void enterView(std::shared_ptr<comm::Group> group);
  virtual void leaveView() {}
};

struct StrategyInputs {
  const TrainerContext& ctx;
  std::shared_ptr<comm::Group> workers;
  std::shared_ptr<torch::nn::Module> module;
  std::optional<torch::nn::Sequential> sequential;
  const TrainerOptions& options;
  const LossFn& loss;
  int64_t totalSteps;          // 0 when unknown (no cosine decay)
  const ProcessGrid* grid;     // the grid strategies' grid (null for the others)
  torch::Tensor sampleInputs;  // a micro-batch of inputs: what a pipeline plans with
};

std::unique_ptr<DistributionStrategy> makeDdpStrategy(const StrategyInputs& in);
std::unique_ptr<DistributionStrategy> makeZeroStrategy(const StrategyInputs& in);
std::unique_ptr<DistributionStrategy> makePsStrategy(const StrategyInputs& in);
std::unique_ptr<DistributionStrategy> makeHybridStrategy(const StrategyInputs& in);

}  // namespace shoal::train
