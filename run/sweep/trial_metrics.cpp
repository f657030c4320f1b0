#include "run/sweep/trial_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/socket.h"

namespace shoal::run::sweep {

std::vector<EpochValue> MetricsReader::poll() {
  std::vector<EpochValue> fresh;
  if (truncated_) return fresh;
  Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return fresh;
  char buf[16 << 10];
  while (true) {
    const uint64_t room = kMaxMetricsFileBytes - offset_;
    if (room == 0) {
      truncated_ = true;
      break;
    }
    const ssize_t n =
        ::pread(fd.get(), buf, std::min<uint64_t>(sizeof(buf), room), static_cast<off_t>(offset_));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    offset_ += static_cast<uint64_t>(n);
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c != '\n') {
        if (skippingLine_) continue;
        if (partial_.size() >= kMaxMetricsLineBytes) {
          skippingLine_ = true;
          partial_.clear();
          continue;
        }
        partial_ += c;
        continue;
      }
      const bool skip = skippingLine_;
      skippingLine_ = false;
      std::string line = std::move(partial_);
      partial_.clear();
      if (skip) continue;
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) continue;
      const auto m = j.find(metric_);
      if (m == j.end() || !m->is_number()) continue;
      EpochValue e;
      e.value = m->get<double>();
      e.epoch = static_cast<int>(curve_.size()) + 1;
      if (const auto ep = j.find("epoch"); ep != j.end() && ep->is_number_integer() &&
                                           ep->get<int64_t>() > 0 &&
                                           ep->get<int64_t>() < (1 << 30)) {
        e.epoch = static_cast<int>(ep->get<int64_t>());
      }
      if (!std::isfinite(e.value)) e.value = NAN;
      curve_.push_back(e);
      fresh.push_back(e);
    }
  }
  return fresh;
}

}  // namespace shoal::run::sweep
