#include "train/hybrid_parallel.h"

#include <fmt/format.h>

#include <optional>
#include <regex>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/pipeline/stage_checkpoint.h"

namespace shoal::train {

HybridParallel::HybridParallel(torch::nn::Sequential model, const ProcessGrid& grid,
                               const torch::Tensor& sampleMicroBatch, pipeline::LossFn loss,
                               HybridOptions options)
    : grid_(grid),
      model_(std::move(model)),
      loss_(std::move(loss)),
      precision_(options.precision),
      scaler_(options.precision, options.scaler) {
  if (grid_.pipelineSize > 1) {
    // The pipeline runs the loss on the last stage: there it is scaled for backward.
    pipeline::LossFn scaled = [this](const torch::Tensor& out, const torch::Tensor& y) {
      return scaler_.scale(loss_(out, y));
    };
    AutocastGuard autocast(precision_);  // the plan's shapes and dtypes are those of training
    pipeline_ = std::make_unique<pipeline::Pipeline>(model_, grid_.pipelineGrid(), sampleMicroBatch,
                                                     scaled, options.pipeline);
  } else if (grid_.dataSize > 1) {
    ddp_ = std::make_unique<DistributedDataParallel>(model_.ptr(), grid_.data, options.ddp);
  }
  if (precision_ == Precision::kFloat16) fp16_ = std::make_unique<Fp16Weights>(parameters());
}

HybridParallel::~HybridParallel() = default;

torch::Tensor HybridParallel::share(const torch::Tensor& batch) const {
  if (!batch.defined() || grid_.dataSize == 1) return batch;
  if (batch.size(0) % grid_.dataSize != 0) {
    SHOAL_THROW(InvalidArgument, "hybrid parallel: a batch of {} does not divide over data {}",
                batch.size(0), grid_.dataSize);
  }
  const int64_t n = batch.size(0) / grid_.dataSize;
  return batch.narrow(0, grid_.dataRank * n, n);
}

double HybridParallel::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  torch::Tensor x = share(inputs), y = share(targets);
  double loss = 0;
  std::optional<Fp16Weights::Scope> fp16;
  if (fp16_) fp16.emplace(fp16_->scope());
  if (pipeline_) {
    AutocastGuard autocast(precision_);
    loss = pipeline_->step(x, y).item<double>() / scaler_.currentScale();
  } else {
    if (ddp_) ddp_->beforeForward();
    torch::Tensor l;
    {
      AutocastGuard autocast(precision_);
      l = loss_(model_->forward(x), y);
    }
    if (ddp_) {
      ddp_->backward(scaler_.scale(l));
    } else {
      scaler_.scale(l).backward();
    }
    loss = l.item<double>();
  }
  // The replicas' losses are of equal shares: their mean is the global batch's.
  if (grid_.dataSize > 1)
    comm::allreduce(*grid_.data, &loss, 1, DataType::kFloat64, ReduceOp::kAvg);
  return loss;
}

bool HybridParallel::optimizerStep(torch::optim::Optimizer& optimizer) {
  if (!scaler_.enabled()) {
    optimizer.step();
    return true;
  }
  return scaler_.step(optimizer, parameters(), {grid_.tensor, grid_.pipe, grid_.data});
}

double HybridParallel::evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) {
  auto sums = evaluateShare(inputs, targets, /*classes=*/false);
  comm::allreduce(*grid_.world, sums.data(), sums.size(), DataType::kFloat64, ReduceOp::kSum);
  return sums[0] / sums[2];
}

std::array<double, 3> HybridParallel::evaluateShare(const torch::Tensor& inputs,
                                                    const torch::Tensor& targets, bool classes) {
  const int64_t n = inputs.size(0);
  const int64_t begin = n * grid_.dataRank / grid_.dataSize;
  const int64_t rows = n * (grid_.dataRank + 1) / grid_.dataSize - begin;
  if (rows == 0) return {0, 0, 0};  // on every stage of this replica alike
  torch::Tensor x = inputs.narrow(0, begin, rows), y = targets.narrow(0, begin, rows);
  torch::NoGradGuard noGrad;
  AutocastGuard autocast(precision_);
  torch::Tensor out;
  if (pipeline_) {
    // The pipeline cuts the batch into its micro-batches: a short share is padded with copies of
    // its last row.
    const int64_t micro = pipeline_->schedule().microBatches;
    if (rows < micro) {
      std::vector<int64_t> tail = x.sizes().vec();
      tail[0] = micro - rows;
      x = torch::cat({x, x.narrow(0, rows - 1, 1).expand(tail)});
    }
    out = pipeline_->predict(x);
    if (out.defined()) out = out.narrow(0, 0, rows);
  } else {
    out = model_->forward(x);
  }
  if (!out.defined()) return {0, 0, 0};  // not the last stage
  // Every tensor rank of the last stage computes the loss (it may be collective over them: a
  // vocabulary-parallel loss); tensor rank 0 counts it.
  const double loss = loss_(out, y).item<double>();
  if (grid_.tensorRank != 0) return {0, 0, 0};
  const double correct =
      classes ? static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>()) : 0;
  return {loss * static_cast<double>(rows), correct, static_cast<double>(rows)};
}

std::unique_ptr<ShardedCheckpointer> HybridParallel::checkpointer(const std::string& dir,
                                                                  int keep) {
  if (pipeline_) {
    return std::make_unique<ShardedCheckpointer>(dir, keep, pipeline::shardPlace(*pipeline_),
                                                 pipeline_->stageModule());
  }
  ShardPlace place{grid_.world, grid_.data,
                   grid_.tensorSize > 1 ? fmt::format("tensor-{}", grid_.tensorRank) : "model",
                   fmt::format("tensor layout v1: tensor {}", grid_.tensorSize)};
  return std::make_unique<ShardedCheckpointer>(dir, keep, std::move(place), *model_);
}

std::vector<torch::Tensor> HybridParallel::parameters() const {
  return pipeline_ ? pipeline_->parameters() : model_->parameters();
}

FullState HybridParallel::gatherFullState() {
  if (!pipeline_) return train::gatherFullState(*model_);
  // The stage's chunks are named "chunk<c>.<layer name>": the layer names are the model's.
  FullState mine = train::gatherFullState(pipeline_->stageModule());
  static const std::regex chunk(R"(^chunk\d+\.)");
  for (auto& [name, t] : mine) name = std::regex_replace(name, chunk, "");
  // Each stage's gathered state, broadcast over the pipeline group in stage order.
  FullState all;
  const std::string encoded = encodeFullState(mine);
  for (int s = 0; s < grid_.pipelineSize; ++s) {
    const std::string bytes = comm::broadcastBytes(
        *grid_.pipe, s == grid_.pipelineRank ? encoded : std::string(), s, SIZE_MAX);
    FullState part =
        s == grid_.pipelineRank ? mine : decodeFullState(bytes, fmt::format("stage {}", s));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

}  // namespace shoal::train
