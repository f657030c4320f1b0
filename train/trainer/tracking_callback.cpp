#include "train/trainer/tracking_callback.h"

#include <algorithm>

namespace shoal::train {

void TrackingCallback::onStep(const StepInfo& s) {
  tracker_.log("loss", s.step, s.loss);
  tracker_.log("step_time_s", s.step, s.seconds);
  tracker_.log("compute_s", s.step, s.computeSeconds);
  tracker_.log("communication_s", s.step, s.communicationSeconds);
  tracker_.log("waiting_s", s.step, s.waitingSeconds);
  if (s.seconds > 0) {
    tracker_.log("samples_per_s", s.step, static_cast<double>(s.samples) / s.seconds);
  }
  tracker_.log("lr", s.step, s.lr);
  if (options_.commWait) tracker_.log("comm_wait_s", s.step, s.commWaitSeconds);
  if (s.stragglers && !s.stragglers->medians.empty() && s.stragglers->medians[0] > 0) {
    // Phase 0 is the Trainer's compute.
    tracker_.log(
        "compute_ratio", s.step,
        s.stragglers->means[0].at(static_cast<size_t>(options_.rank)) / s.stragglers->medians[0]);
  }
  if (s.stragglers) {
    // The job's own verdict, at its threshold and persistence: what the dashboard and the
    // report show, rather than judging compute_ratio by a rule of their own.
    const auto& named = s.stragglers->stragglers;
    const bool slow = std::any_of(named.begin(), named.end(), [this](const comm::Straggler& x) {
      return x.rank == options_.rank;
    });
    tracker_.log("straggler", s.step, slow ? 1.0 : 0.0);
  }
  if (s.autotuneChoice >= 0) {
    tracker_.log("autotune_choice", s.step, static_cast<double>(s.autotuneChoice));
  }
}

void TrackingCallback::onValidation(const EpochMetrics& m) {
  if (!options_.lead) return;
  tracker_.log("validation_loss", m.step, m.validationLoss);
  if (m.validationAccuracy >= 0) tracker_.log("test_accuracy", m.step, m.validationAccuracy);
}

void TrackingCallback::onEpoch(const EpochMetrics& m) {
  if (!options_.lead) return;
  tracker_.log("epoch_loss", m.step, m.trainLoss);
  if (m.trainSeconds > 0) {
    tracker_.log("job_samples_per_s", m.step, static_cast<double>(m.samples) / m.trainSeconds);
  }
}

}  // namespace shoal::train
