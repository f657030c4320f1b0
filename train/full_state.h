// A model's full (one-process) state by name, its parameters and its buffers (BatchNorm's running
// statistics): what a model trained split over tensor and pipeline ranks, or replicated by DDP
// and ZeRO, is gathered into, written as, and loaded from, so that it can be taken away and run
// in one process (or resumed on another grid). Without the buffers a model with BatchNorm would
// load and then evaluate with its initial statistics: plausible-looking, silently wrong outputs.
//
// The file is a sealed file (common/sealed_file.h: length and SHA-256 checked before anything is
// deserialized, written atomically) holding a tensor bundle of the named tensors
// (train/tensor_bundle.h; earlier Shoal versions wrote a libtorch archive, now refused by name).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace shoal::train {

using FullState = std::vector<std::pair<std::string, torch::Tensor>>;

// The full parameters and buffers of `model` (or any module built from train/tensor/'s layers)
// under the names the one-process model gives them: tensor-parallel layers
// (tensor::ParallelLayer) are gathered, whole ones copied (their buffers this rank's: a replica's
// running statistics are its own). Collective over every tensor group the layers use (every rank of
// it calls this, in the same order); every rank gets the result.
FullState gatherFullState(const torch::nn::Module& model);

// The state as bytes (a tensor bundle) and back; decode throws InvalidArgument for bytes that
// are not one (`what` names their source in the message).
std::string encodeFullState(const FullState& state);
FullState decodeFullState(const std::string& bytes, const std::string& what);

// Writes / reads a sealed file. Reading throws InvalidArgument for a truncated, corrupt or
// foreign file (naming it).
void writeFullState(const std::string& path, const FullState& state);
FullState readFullState(const std::string& path);

// Copies `state` into `model`'s parameters and buffers by name. InvalidArgument, before anything
// is copied, naming the first parameter or buffer missing from the state (a file written before
// buffers were gathered, for a model that has some), left over in it, or of another shape.
void loadFullState(torch::nn::Module& model, const FullState& state);

}  // namespace shoal::train
