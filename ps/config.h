// What a parameter-server job trains with: the consistency mode and the optimizer the servers
// apply. Workers send it in their hello (all must agree); servers need no flags of their own
// beyond where to checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/optimizer_config.h"

namespace shoal::ps {

// kSync: a step is applied once every worker's gradient for it arrived, averaged (bulk
// synchronous). kAsync: each gradient is applied on arrival. kSsp: applied on arrival, but a
// worker may run at most `staleness` steps ahead of the slowest one (stale synchronous
// parallel): its pull blocks only when it would exceed that.
enum class Mode : uint8_t { kSync = 0, kAsync = 1, kSsp = 2 };
Mode parseMode(std::string_view name);  // sync | async | ssp (also ps-sync, ps-async, ps-ssp)
std::string_view toString(Mode mode);

struct TrainingConfig {
  Mode mode = Mode::kSync;
  int staleness = 0;  // kSsp only
  OptimizerOptions optimizer;
  // The learning-rate schedule in worker steps (common/optimizer_config.h). In synchronous mode
  // one update averages every worker's batch, so linear scaling multiplies the rate by the
  // number of workers; in the asynchronous modes each update is one worker's batch and the rate
  // is the one-worker rate.
  bool linearScaling = false;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 0;

  // The schedule the servers follow with `workers` workers (the rule above).
  LrSchedule schedule(int workers) const;

  // "key=value" pairs, and back (ProtocolError / InvalidArgument on bad text or values).
  std::string toText() const;
  static TrainingConfig parse(std::string_view text);
  // Throws InvalidArgument on an out-of-range value or a layer-wise optimizer (lamb, lars).
  void validate() const;
};

}  // namespace shoal::ps
