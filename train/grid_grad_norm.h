// Gradient clipping for a model split over a process grid (train/process_grid.h): the L2 norm of
// the whole one-process model's gradient, from the pieces each rank holds, so that every rank
// clips by the same factor and the split model steps as the one-process model would.
//
// What each rank counts: its stage's parameters (the pipeline's stages hold disjoint layers:
// summed over the pipeline group), the slices of tensor-parallel layers (tensor::ParallelLayer,
// where sliced() says so: summed over the tensor group) and the parameters whole on every tensor
// rank only once (tensor rank 0's). The data replicas hold the same averaged gradient and are
// not summed. Parameters without a gradient count zero.
//
// Collective over grid.tensor and grid.pipe (one all-reduce of one double each, in that order),
// after the gradients are complete and before the optimizer step. Blocking, bounded by the
// groups' timeouts; failures are the groups'. InvalidArgument for maxNorm not positive and
// finite.
#pragma once

#include <torch/torch.h>

#include "train/process_grid.h"

namespace shoal::train {

// The full model's gradient norm. `local` is this rank's part of the model (a pipeline's stage
// module, or the whole model without pipeline parallelism).
double gridGradNorm(torch::nn::Module& local, const ProcessGrid& grid);

// Scales every local gradient by min(1, maxNorm / norm) (as torch::nn::utils::clip_grad_norm_
// does for one process). Returns the norm before clipping.
double clipGridGradNorm(torch::nn::Module& local, const ProcessGrid& grid, double maxNorm);

}  // namespace shoal::train
