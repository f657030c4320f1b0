#include "train/tensor/mlp.h"

#include "common/error.h"
#include "train/process_grid.h"

namespace shoal::train::tensor {

ParallelMlpImpl::ParallelMlpImpl(const MlpWeights& full, TensorGroup tg) {
  const int64_t inner = full.fc1Weight.size(0);
  requireDivisible("feed-forward units", inner, "tensor", tg.size());
  fc1 = register_module("fc1", ColumnParallelLinear(full.fc1Weight, full.fc1Bias, tg));
  fc2 = register_module("fc2", RowParallelLinear(full.fc2Weight, full.fc2Bias, tg));
}

torch::Tensor ParallelMlpImpl::forward(const torch::Tensor& x) {
  return fc2->forward(torch::gelu(fc1->forward(x)));
}

}  // namespace shoal::train::tensor
