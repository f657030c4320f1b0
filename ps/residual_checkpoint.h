// A parameter-server worker's error-feedback residuals (top-k, 1-bit: ps/payload_codec.h) saved
// beside the servers' checkpoints, so that a resumed job continues with what each worker held
// back instead of dropping it (ClientOptions::checkpointDir in ps/client.h).
//
// Files: <dir>/worker-<w>/residual-<T>.bin, sealed (common/sealed_file.h), T the step the
// servers resume at. Payload: one text line "shoal ps residual 1 worker <w> elements <n> step
// <T>", then n float32 (the model's elements in partition order).
//
// When: a step's residual is final once the worker's pushes of that step have covered every
// element of the model (one whole-model push, or one push per key), and it is written then,
// before the last of those pushes is sent (ps::Client encodes a call's pieces before it sends
// any): the server that push goes to cannot checkpoint step T before the file exists, and the
// servers resume only from a step every one of them checkpointed. So the step a job resumes at
// always has each worker's file, whichever worker or server died.
//
// Thread-safety: none; the worker's issuing thread owns it. Errors: SystemError for a file that
// cannot be written (the call that completed the step then sends nothing), InvalidArgument naming
// the file for one that is damaged or not this worker's when read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/sealed_file.h"

namespace shoal::ps {

class ResidualCheckpoints {
 public:
  // Steps that are multiples of `every` are saved (0: only by finish()); the newest `keep` files
  // are kept (the servers' ServerOptions::checkpointEvery and keep).
  ResidualCheckpoints(const std::string& dir, int worker, int64_t every, int keep, size_t elements);

  // `count` elements of step `step` were just encoded, leaving `residual`. Writes the file of
  // step + 1 when this completes the step's elements and step + 1 is due.
  void encoded(int64_t step, size_t count, std::span<const float> residual);
  // The end of training: writes the file of the last complete step's successor unless written.
  void finish(std::span<const float> residual);

  // The residual saved for the servers' resume step `step`; nothing (the reason in *why) when
  // there is no such file.
  std::optional<std::vector<float>> load(int64_t step, std::string* why) const;

 private:
  void write(int64_t step, std::span<const float> residual);

  SealedSeries series_;
  int worker_;
  int64_t every_;
  size_t elements_;
  int64_t step_ = -1;  // the step whose elements are being counted
  size_t counted_ = 0;
  int64_t complete_ = 0;  // the newest step whose successor's residual is final
  int64_t written_ = -1;
};

}  // namespace shoal::ps
