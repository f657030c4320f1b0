// Checkpoints that are never half-written and never loaded corrupt.
//
// Sealed files (common/sealed_file.h: length, SHA-256, atomic rename) holding a libtorch archive:
// model parameters and buffers, optimizer state, progress, every rank's RNG state. Reading
// verifies length and checksum before anything is deserialized.
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

  // Writes ckpt-<step>.pt. Returns its path (on every rank).
  std::string save(comm::Group& group, torch::nn::Module& model, torch::optim::Optimizer& opt,
                   const Progress& progress);

  // Loads `path` into model and optimizer, restores this rank's RNG, returns the progress.
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
