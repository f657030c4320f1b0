// A worker's error-feedback residuals beside the servers' checkpoints (ps/residual_checkpoint.h).
#include "ps/residual_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace shoal::ps {

namespace {

std::string header(int worker, size_t elements, int64_t step) {
  return fmt::format("shoal ps residual 1 worker {} elements {} step {}\n", worker, elements, step);
}

}  // namespace

ResidualCheckpoints::ResidualCheckpoints(const std::string& dir, int worker, int64_t every,
                                         int keep, size_t elements)
    : series_(fmt::format("{}/worker-{}", dir, worker), "residual-", ".bin", keep),
      worker_(worker),
      every_(every),
      elements_(elements) {}

void ResidualCheckpoints::encoded(int64_t step, size_t count, std::span<const float> residual) {
  if (step != step_) {
    step_ = step;
    counted_ = 0;
  }
  counted_ += count;
  if (counted_ != elements_) return;
  complete_ = step + 1;
  if (every_ > 0 && complete_ % every_ == 0) write(complete_, residual);
}

void ResidualCheckpoints::finish(std::span<const float> residual) {
  if (complete_ > 0 && written_ != complete_) write(complete_, residual);
}

void ResidualCheckpoints::write(int64_t step, std::span<const float> residual) {
  SHOAL_ASSERT(residual.size() == elements_, "a residual of {} elements for a model of {}",
               residual.size(), elements_);
  std::string payload = header(worker_, elements_, step);
  const size_t at = payload.size();
  payload.resize(at + elements_ * sizeof(float));
  std::memcpy(payload.data() + at, residual.data(), elements_ * sizeof(float));
  try {
    series_.write(step, payload);
  } catch (const std::exception& e) {
    // The disk's failure, not the caller's: SystemError whatever the writer threw.
    SHOAL_THROW(SystemError, "worker {}: saving its error-feedback residuals of step {}: {}",
                worker_, step, e.what());
  }
  written_ = step;
}

std::optional<std::vector<float>> ResidualCheckpoints::load(int64_t step, std::string* why) const {
  const std::string path = series_.pathFor(step);
  if (!std::filesystem::exists(path)) {
    *why = fmt::format("no error-feedback residuals for step {} in {}", step, series_.dir());
    return std::nullopt;
  }
  const std::string expected = header(worker_, elements_, step);
  // Checked before reading: a file far larger than this model's residuals is not read whole.
  const uint64_t most = expected.size() + elements_ * sizeof(float) + 4096;  // + the framing
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > most) {
    SHOAL_THROW(InvalidArgument,
                "{}: {} bytes, more than worker {}'s residuals of {} elements for step {} take",
                path, size, worker_, elements_, step);
  }
  const std::string payload = readSealedFile(path);  // InvalidArgument naming it if damaged
  if (payload.size() != expected.size() + elements_ * sizeof(float) ||
      payload.compare(0, expected.size(), expected) != 0) {
    const std::string first = payload.substr(0, std::min<size_t>(payload.find('\n'), 120));
    SHOAL_THROW(InvalidArgument,
                "{}: not worker {}'s residuals of {} elements for step {} ({} bytes, '{}')", path,
                worker_, elements_, step, payload.size(), first);
  }
  std::vector<float> residual(elements_);
  std::memcpy(residual.data(), payload.data() + expected.size(), elements_ * sizeof(float));
  return residual;
}

}  // namespace shoal::ps
