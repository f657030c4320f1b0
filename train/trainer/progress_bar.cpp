#include "train/trainer/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace shoal::train {

void ProgressBar::onStep(const StepInfo& s) {
  const auto now = std::chrono::steady_clock::now();
  if (s.epoch != epoch_) {
    epoch_ = s.epoch;
    // The first step's micro-batches are already done: the bar starts just before them.
    firstBatch_ = s.batchInEpoch - 1;
    lastDone_ = firstBatch_;
    samples_ = 0;
    lossSum_ = 0;
    steps_ = 0;
    start_ = now;
    tty_ = ::isatty(1) != 0;
  }
  samples_ += s.jobSamples;
  lossSum_ += s.loss;
  ++steps_;
  const int64_t total = std::max<int64_t>(s.batchesInEpoch, 1);
  const int64_t done = s.batchInEpoch;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(samples_) / elapsed : 0;
  const int64_t ranHere = done - firstBatch_;
  const double eta =
      ranHere > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(ranHere) : 0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  const std::string line =
      fmt::format("epoch {}/{} [{}{}] {:>3}% {:>7.0f} samples/s loss {:.4f} ETA {:.0f}s",
                  s.epoch + 1, epochs_, std::string(filled, '#'), std::string(kWidth - filled, '.'),
                  100 * done / total, rate, lossSum_ / static_cast<double>(steps_), eta);
  if (tty_) {
    std::printf("\r%s%s", line.c_str(), done == total ? "\n" : "");
  } else if (done == total || done * 5 / total != lastDone_ * 5 / total) {
    std::printf("%s\n", line.c_str());
  }
  lastDone_ = done;
  std::fflush(stdout);
}

}  // namespace shoal::train
