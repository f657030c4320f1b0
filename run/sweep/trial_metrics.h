// Reading the per-epoch metric a trial appends to its metrics file: one JSON object per line,
// e.g. {"epoch": 2, "test_accuracy": 0.84, ...} (examples/fashion_mnist.cpp's --metrics).
//
// The file is untrusted and may be mid-write: a last line without its newline is not read yet;
// a complete line that is not a JSON object with the metric as a number is skipped; lines
// longer than kMaxMetricsLineBytes are skipped unread. An epoch is the line's "epoch" when it is
// a positive integer, else the count of metric lines so far. Reads are incremental (from where
// the previous one stopped), and never read more than kMaxMetricsFileBytes in all.
// Not thread-safe; blocking only on the file system.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shoal::run::sweep {

inline constexpr uint64_t kMaxMetricsFileBytes = 16 << 20;
inline constexpr size_t kMaxMetricsLineBytes = 64 << 10;

struct EpochValue {
  int epoch = 0;
  double value = 0;
};

class MetricsReader {
 public:
  MetricsReader(std::string path, std::string metric)
      : path_(std::move(path)), metric_(std::move(metric)) {}

  // The epochs completed since the last call, in file order. A missing file is no epochs yet.
  std::vector<EpochValue> poll();
  // Every epoch read so far.
  const std::vector<EpochValue>& curve() const { return curve_; }
  // True once the file outgrew kMaxMetricsFileBytes (reading stopped there).
  bool truncated() const { return truncated_; }

 private:
  std::string path_, metric_;
  uint64_t offset_ = 0;
  std::string partial_;        // a line read without its newline yet
  bool skippingLine_ = false;  // inside an overlong line
  bool truncated_ = false;
  std::vector<EpochValue> curve_;
};

}  // namespace shoal::run::sweep
