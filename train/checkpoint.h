// Checkpoints that are never half-written and never loaded corrupt.
//
// File format: "SHOALCK1", u64 payload length (little endian), the payload (a libtorch archive:
// model parameters and buffers, optimizer state, progress, every rank's RNG state), then the
// SHA-256 of the payload. Written to <name>.tmp, fsync'ed, renamed over <name>, and the folder
// fsync'ed: a crash at any point leaves either the old set of checkpoints or the new one.
// Reading verifies length and checksum before anything is deserialized; a truncated or corrupt
// file is an InvalidArgument naming the file and what is wrong.
//
// Collective: save() and load() are called by every rank (rank 0 writes and reads the file;
// the RNG states travel through the group).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"

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
  std::string dir_;
  int keep_;
};

}  // namespace shoal::train
