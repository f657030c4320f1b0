#include "run/trace_session.h"

#include <filesystem>

#include "comm/clock_sync.h"
#include "common/error.h"
#include "common/log.h"

namespace shoal::run {

std::string rankTraceFileName(int rank) {
  return fmt::format("trace.rank{}.json", rank);
}

TraceSession::TraceSession(comm::Group& world, std::string dir, bool measureClock)
    : sink_(world.options().trace) {
  SHOAL_CHECK(sink_ != nullptr, "rank {}: a trace session needs a group with a trace sink",
              world.rank());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    SHOAL_THROW(InvalidArgument, "SHOAL_TRACE={}: cannot create the folder ({})", dir,
                ec ? ec.message() : "not a folder");
  }
  path_ = (std::filesystem::path(dir) / rankTraceFileName(world.rank())).string();
  info_.rank = world.rank();
  info_.host = localHostName();
  info_.clockMeasured = measureClock;
  comm::ClockOffset offset;
  if (measureClock) {
    // Every rank measures: the offset is collective. Against the sink's own clock, since it is
    // the sink's times the offset shifts.
    comm::ClockSyncOptions o;
    o.clock = [sink = sink_] { return sink->now(); };
    offset = comm::measureClockOffset(world, o);
  }
  info_.clockOffsetNs = offset.offsetNs;
  info_.clockErrorNs = offset.errorNs;
  SHOAL_LOG_INFO("rank {}: tracing into {} ({} spans kept); clock offset {} ns, +/- {} ns",
                 info_.rank, path_, sink_->capacity(), offset.offsetNs, offset.errorNs);
}

TraceSession::~TraceSession() {
  try {
    write();
  } catch (const std::exception& e) {
    SHOAL_LOG_WARN("rank {}: the trace was not written: {}", info_.rank, e.what());
  }
}

void TraceSession::write() {
  std::lock_guard<std::mutex> lock(writeMutex_);
  writeRankTrace(*sink_, info_, path_);
}

}  // namespace shoal::run
