#include "run/trace_session.h"

#include <exception>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"

namespace shoal::run {

std::string rankTraceFileName(int rank) {
  return fmt::format("trace.rank{}.json", rank);
}

TraceSession::TraceSession(const std::shared_ptr<comm::Group>& world, std::string dir,
                           bool measureClock)
    : world_(world) {
  SHOAL_CHECK(world != nullptr, "a trace session needs a group");
  sink_ = world->options().trace;
  SHOAL_CHECK(sink_ != nullptr, "rank {}: a trace session needs a group with a trace sink",
              world->rank());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    SHOAL_THROW(InvalidArgument, "SHOAL_TRACE={}: cannot create the folder ({})", dir,
                ec ? ec.message() : "not a folder");
  }
  path_ = (std::filesystem::path(dir) / rankTraceFileName(world->rank())).string();
  info_.rank = world->rank();
  info_.host = localHostName();
  info_.clockMeasured = measureClock;
  comm::ClockOffset offset;
  if (measureClock) {
    std::lock_guard<std::mutex> lock(callMutex_);
    offset = measure(*world, std::nullopt);
  }
  SHOAL_LOG_INFO("rank {}: tracing into {} ({} spans kept); clock offset {} ns, +/- {} ns",
                 info_.rank, path_, sink_->capacity(), offset.offsetNs, offset.errorNs);
}

TraceSession::~TraceSession() {
  try {
    finish();
  } catch (const std::exception& e) {
    SHOAL_LOG_WARN("rank {}: the trace was not written: {}", info_.rank, e.what());
  }
}

comm::ClockOffset TraceSession::measure(comm::Group& world, std::optional<Duration> timeout) {
  // Against the sink's own clock, since it is the sink's times the offset shifts.
  comm::ClockSyncOptions o;
  o.clock = [sink = sink_] { return sink->now(); };
  o.call.timeout = timeout;
  comm::ClockOffset offset;
  try {
    offset = comm::measureClockOffset(world, o);
  } catch (...) {
    broken_ = true;
    throw;
  }
  std::lock_guard<std::mutex> lock(infoMutex_);
  auto& samples = info_.clockSamples;
  if (samples.empty()) {
    // The first: the offset the file's times are shifted by (common/trace_file.h).
    info_.clockOffsetNs = offset.offsetNs;
    info_.clockErrorNs = offset.errorNs;
  }
  if (samples.size() >= kMaxClockSamples) {
    // Keep the first, the last and every other one between: half as dense, the same span.
    std::vector<ClockSample> thinned;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (i == 0 || i + 1 == samples.size() || i % 2 == 0) thinned.push_back(samples[i]);
    }
    samples = std::move(thinned);
  }
  samples.push_back({offset.atNs, offset.offsetNs, offset.errorNs});
  return offset;
}

std::optional<comm::ClockOffset> TraceSession::resync(std::optional<Duration> timeout) {
  std::lock_guard<std::mutex> lock(callMutex_);
  if (!info_.clockMeasured) return std::nullopt;
  const auto world = world_.lock();
  if (!world) {
    SHOAL_THROW(InvalidArgument, "rank {}: trace resync: the world group is gone", info_.rank);
  }
  if (broken_) {
    SHOAL_THROW(PeerError,
                "rank {}: trace resync: an earlier clock measurement failed, so the world group "
                "cannot be used for another",
                info_.rank);
  }
  const comm::ClockOffset offset = measure(*world, timeout);
  SHOAL_LOG_DEBUG("rank {}: clock offset {} ns, +/- {} ns (resync)", info_.rank, offset.offsetNs,
                  offset.errorNs);
  return offset;
}

bool TraceSession::resyncEvery(int64_t step, int64_t everySteps, std::optional<Duration> timeout) {
  if (everySteps < 1) {
    SHOAL_THROW(InvalidArgument, "trace resync every {} steps: expected at least 1", everySteps);
  }
  if (step <= 0 || step % everySteps != 0) return false;
  return resync(timeout).has_value();
}

void TraceSession::finish(std::optional<Duration> timeout) {
  {
    std::lock_guard<std::mutex> lock(callMutex_);
    const bool first = !finished_;
    finished_ = true;
    // Not while unwinding: this rank is failing, and its peers may be waiting for it in an
    // operation that will now never complete; it must leave at once, not wait for them here.
    const auto world = world_.lock();
    if (first && info_.clockMeasured && !broken_ && world && std::uncaught_exceptions() == 0) {
      try {
        measure(*world, timeout);
      } catch (const std::exception& e) {
        SHOAL_LOG_WARN(
            "rank {}: the last clock measurement failed, so the last spans are aligned by the "
            "offset measured before: {}",
            info_.rank, e.what());
      }
    }
  }
  write();
}

void TraceSession::write() {
  std::lock_guard<std::mutex> lock(writeMutex_);
  writeRankTrace(*sink_, info(), path_);
}

RankTraceInfo TraceSession::info() const {
  std::lock_guard<std::mutex> lock(infoMutex_);
  return info_;
}

}  // namespace shoal::run
