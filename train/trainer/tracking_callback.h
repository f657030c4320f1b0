// A Trainer callback (train/trainer.h) that logs the run's metrics into the experiment tracker
// (track/tracker.h; under `shoal run --run-dir DIR`, DIR/metrics.db: the dashboard's curves).
//
// Every worker, every step: loss, step_time_s, samples_per_s, lr; the step time's three parts
// compute_s, communication_s and waiting_s (they add up to step_time_s: Note [Step-time
// breakdown] in train/trainer.h); comm_wait_s where the strategy waits for communication at a
// step's end (ddp); compute_ratio (this rank's compute time over the median rank's) at each
// straggler window's end, with straggler (1 when the job's monitor names this rank at that
// window, at its own threshold and persistence, else 0); autotune_choice on the step the autotuner
// chose. The lead (worker 0), after each validation and epoch: validation_loss, test_accuracy
// (class targets), epoch_loss and job_samples_per_s. In an elastic job the rank and the lead
// follow the views: at each change the rank becomes this worker's in the new view, and the lead
// its rank 0.
//
// Threading: the training thread's (Tracker::log is non-blocking). Errors: the tracker's writer
// error is rethrown by the log that meets it. The tracker must outlive the callback.
#pragma once

#include "track/tracker.h"
#include "train/trainer.h"

namespace shoal::train {

struct TrackingOptions {
  int rank = 0;           // this worker's rank in Trainer::workers()
  bool lead = false;      // logs the job-wide numbers (one worker of the job)
  bool commWait = false;  // log comm_wait_s (the strategy measures it: ddp)
};

class TrackingCallback final : public Callback {
 public:
  TrackingCallback(track::Tracker& tracker, TrackingOptions options)
      : tracker_(tracker), options_(options) {}

  void onStep(const StepInfo& step) override;
  void onValidation(const EpochMetrics& m) override;
  void onEpoch(const EpochMetrics& m) override;
  void onViewChange(const ViewChange& v) override {
    options_.rank = v.rank;
    options_.lead = v.rank == 0;
  }

 private:
  track::Tracker& tracker_;
  TrackingOptions options_;
};

}  // namespace shoal::train
