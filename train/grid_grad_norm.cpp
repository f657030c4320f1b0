#include "train/grid_grad_norm.h"

#include <cmath>
#include <unordered_set>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor/parallel_layer.h"

namespace shoal::train {

namespace {

double squaredNorm(const torch::Tensor& grad) {
  return grad.defined() ? grad.detach().to(torch::kFloat64).pow(2).sum().item<double>() : 0.0;
}

}  // namespace

double gridGradNorm(torch::nn::Module& local, const ProcessGrid& grid) {
  // A module shared by two parents appears twice in named_modules(): count each tensor once.
  std::unordered_set<const void*> seen;
  double sum = 0;
  for (const auto& item : local.named_modules()) {
    const auto* layer = dynamic_cast<const tensor::ParallelLayer*>(item.value().get());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
      const bool slice = layer != nullptr && layer->sliced(p.key());
      // Whole on every tensor rank: tensor rank 0 counts it for them all.
      if (slice || grid.tensorRank == 0) sum += squaredNorm(p.value().grad());
    }
  }
  if (grid.tensorSize > 1)
    comm::allreduce(*grid.tensor, &sum, 1, DataType::kFloat64, ReduceOp::kSum);
  if (grid.pipelineSize > 1)
    comm::allreduce(*grid.pipe, &sum, 1, DataType::kFloat64, ReduceOp::kSum);
  return std::sqrt(sum);
}

double clipGridGradNorm(torch::nn::Module& local, const ProcessGrid& grid, double maxNorm) {
  SHOAL_CHECK(maxNorm > 0 && std::isfinite(maxNorm),
              "gradient clipping: the maximum norm must be positive and finite, not {}", maxNorm);
  const double norm = gridGradNorm(local, grid);
  // clip_grad_norm_'s epsilon, so a zero gradient is left as it is.
  const double factor = maxNorm / (norm + 1e-6);
  if (factor < 1) {
    torch::NoGradGuard noGrad;
    std::unordered_set<const void*> seen;  // a shared parameter is scaled once
    for (auto& p : local.parameters()) {
      if (p.grad().defined() && seen.insert(p.unsafeGetTensorImpl()).second) p.grad().mul_(factor);
    }
  }
  return norm;
}

}  // namespace shoal::train
