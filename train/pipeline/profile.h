// What each layer of a flat model costs, measured, for the partitioner
// (train/pipeline/partition.h).
//
// Layers are timed as training runs them (Note [Profiling in sweeps] in profile.cpp): a forward
// sweep through all layers, then a backward sweep in reverse, each layer on its own graph so its
// forward and its backward (the gradient of its input and of its parameters for the gradient
// the next layer sent back, ones for the last, and their accumulation as backward adds them
// into .grad) are timed alone. A layer's input is the previous layer's output, detached, and
// requires grad when floating point, as a received activation does in a pipeline; the first
// layer's is the data, whose gradient is not computed. `warmups` untimed sweeps, then the
// median of `repeats` timed ones. On the calling thread, with whatever intra-op threads libtorch
// is set to use; times are as noisy as the machine is busy.
//
// The model is left as it was found: backward goes through torch::autograd::grad, so no
// parameter's .grad is created or changed; parameters are not written; buffers (BatchNorm
// running statistics, which training-mode forwards update) are restored to their values before
// profiling; the CPU generator (dropout) is restored to its state before profiling, so the
// caller's random stream does not depend on whether it profiled. Modules run in the mode they
// are in (train() or eval()).
//
// Blocking, for about (warmups + repeats) forward+backward passes of the model. Thread-
// compatible: the model must not be used by another thread meanwhile. CPU tensors only (times
// of asynchronous devices would need a synchronisation this does not do).
//
// Errors: InvalidArgument (one line) for an empty model, an undefined or non-CPU sample,
// repeats < 1 or warmups < 0; what a layer throws propagates, naming nothing more (the model is
// still restored).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "train/pipeline/partition.h"

namespace shoal::train::pipeline {

struct LayerProfile {
  std::string name;                  // the layer's name in the Sequential
  int64_t parameters = 0;            // parameter elements (all, frozen ones included)
  double forwardMs = 0;              // median forward time
  double backwardMs = 0;             // median backward time
  double ms = 0;                     // median of forward + backward
  int64_t outputBytes = 0;           // numel * element size of the output, per micro-batch
  std::vector<int64_t> outputShape;  // for the sample micro-batch
};

std::vector<LayerProfile> profileLayers(torch::nn::Sequential& net,
                                        const torch::Tensor& sampleMicroBatch, int repeats,
                                        int warmups = 2);

// What the partitioner uses of a profile: name, parameters, ms, output bytes.
std::vector<LayerInfo> toLayerInfo(const std::vector<LayerProfile>& profile);

}  // namespace shoal::train::pipeline
