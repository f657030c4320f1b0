// A Trainer callback (train/trainer.h) that draws the epoch's progress on standard output:
//
//   epoch 2/8 [##########....................]  33%    2510 samples/s loss 0.4312 ETA 16s
//
// On a terminal the line redraws in place; into a pipe (shoal run forwards whole lines) it
// prints one line at every fifth of the epoch. The rate is the job's (StepInfo::jobSamples:
// every data replica's samples, under any strategy). Give it to one worker (the lead).
// Threading: the training thread's. Never throws but what stdio does.
#pragma once

#include <chrono>
#include <cstdint>

#include "train/trainer.h"

namespace shoal::train {

class ProgressBar final : public Callback {
 public:
  explicit ProgressBar(int64_t epochs) : epochs_(epochs) {}

  void onStep(const StepInfo& step) override;
  void onEpoch(const EpochMetrics&) override { epoch_ = -1; }

 private:
  int64_t epochs_;
  int64_t epoch_ = -1;      // the epoch drawn; -1 before its first step
  int64_t firstBatch_ = 0;  // where it started (a resumed epoch starts midway)
  int64_t lastDone_ = 0;    // micro-batches done at the previous step
  int64_t samples_ = 0;     // the job's, this epoch
  double lossSum_ = 0;      // over the steps drawn
  int64_t steps_ = 0;       // steps drawn, this epoch
  std::chrono::steady_clock::time_point start_;
  bool tty_ = false;
};

}  // namespace shoal::train
