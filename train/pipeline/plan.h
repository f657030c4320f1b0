// Which layers each virtual stage of a pipeline gets, and what crosses each boundary.
//
// makePlan() runs on one rank (world rank 0): it traces the model layer by layer on a sample
// micro-batch (output shapes and dtypes, hence what each boundary carries and what a receiver
// checks), measures layers if the split is by time, and cuts. The plan then travels to every
// rank as bytes (encode / decode; decode checks every size before using it, as for anything
// read from outside).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "train/pipeline/transfer.h"

namespace shoal::train::pipeline {

enum class SplitMethod { kTime, kParameters, kBoundaries };

struct Plan {
  std::string method;                  // "time", "parameters", "boundaries"
  std::vector<int> boundaries;         // virtual stage s = layers [b[s], b[s+1]); size V+1
  std::vector<BoundarySpec> crossing;  // what crosses boundary s; size V-1
  std::string table;                   // the description printed at start-up
  std::vector<double> layerMs;         // each layer's profiled cost (0s unless split by time)
  int virtualStages() const { return static_cast<int>(boundaries.size()) - 1; }
};

struct PlanRequest {
  int virtualStages = 1;
  int stages = 1;  // ranks: virtual stage s runs on rank s % stages
  SplitMethod split = SplitMethod::kTime;
  std::vector<int> boundaries;  // kBoundaries: first layer of virtual stages 1..V-1
  int profileRepeats = 3;
};

// Checks what can be checked on every rank alike (the same options and model everywhere):
// enough layers, explicit boundaries increasing and in range. InvalidArgument, one line.
void validate(const PlanRequest& request, int layers);

// The plan for `model` on `sample` (one micro-batch). Collective-free; leaves the model's
// parameters and gradients as they were.
Plan makePlan(torch::nn::Sequential& model, const torch::Tensor& sample,
              const PlanRequest& request);

std::string encode(const Plan& plan);
// ProtocolError for bytes that are not a plan of `virtualStages` stages over `layers` layers.
Plan decode(const std::string& bytes, int virtualStages, int layers);

}  // namespace shoal::train::pipeline
