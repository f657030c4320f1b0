// Checkpoints that are never half-written and never loaded corrupt.
//
// Sealed files (common/sealed_file.h: length, SHA-256, atomic rename) holding a tensor bundle
// (train/tensor_bundle.h): model parameters and buffers, the optimizer's state per parameter
// (train/optimizer_state.h: SGD, Adam, AdamW, RMSprop, Lamb, Lars) and each param group's
// learning rate, progress, every rank's RNG state. Reading verifies length and checksum, then
// decodes with every size checked, then checks every tensor against the model and optimizer
// before anything is changed. Files of earlier Shoal versions (libtorch archives) are refused by
// name: reading them ran libtorch's TorchScript importer, which a crafted file crashed.
//
// Collective: save() and load() are called by every rank (rank 0 writes and reads the file;
// the RNG states travel through the group).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "common/sealed_file.h"

namespace shoal::train {

struct Progress {
  int64_t epoch = 0;         // the epoch in progress
  int64_t batchInEpoch = 0;  // batches of it already done
  int64_t step = 0;          // optimizer steps so far
};

class Checkpointer {
 public:
  // Keeps the newest `keep` checkpoints in `dir` (created if missing).
  Checkpointer(std::string dir, int keep);

  // Writes ckpt-<step>.pt. Returns its path (on every rank). InvalidArgument on every rank for an
  // optimizer type whose state cannot be written; SystemError when rank 0's write fails.
  std::string save(comm::Group& group, torch::nn::Module& model, torch::optim::Optimizer& opt,
                   const Progress& progress);

  // Loads `path` into model and optimizer (state and learning rates; other settings stay the
  // optimizer's own), restores this rank's RNG, returns the progress. InvalidArgument, one line
  // naming the file, for a truncated, corrupt or foreign file, a tensor of another shape or dtype
  // or one the model lacks, optimizer state of another kind, another world size; the model,
  // optimizer and RNG are then unchanged.
  Progress load(comm::Group& group, const std::string& path, torch::nn::Module& model,
                torch::optim::Optimizer& opt);

  // The newest checkpoint in the folder, or nothing. Throws InvalidArgument when the newest is
  // truncated or corrupt, naming it and offering the newest good one (never falls back
  // silently).
  std::optional<std::string> latest() const;

  // The checkpoints present, oldest first.
  std::vector<std::string> list() const;

  // Checks a file's framing and checksum (InvalidArgument saying what is wrong).
  static void verify(const std::string& path);

 private:
  SealedSeries series_;
};

}  // namespace shoal::train
