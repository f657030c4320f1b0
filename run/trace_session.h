// The timeline of one rank's world, as shoal::init() sets it up under SHOAL_TRACE=DIR: the
// world group's trace sink, this rank's clock offset against rank 0 (measured once, at start),
// and the file DIR/trace.rank<R>.json that the session writes when it goes (README "Timeline").
//
// Threading: write() may be called from any thread; the destructor writes once more (the last
// copy of shoal::World going away), logging instead of throwing what fails.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "comm/group.h"
#include "common/trace_file.h"

namespace shoal::run {

// "trace.rank<R>.json": the name each rank's file has in the trace folder.
std::string rankTraceFileName(int rank);

class TraceSession {
 public:
  // Collective over `world` with `measureClock`, whose options carry the sink
  // (GroupOptions::trace, non-null): creates `dir` if missing (InvalidArgument naming it if it
  // cannot), then measures this rank's clock offset against rank 0 (comm/clock_sync.h; its
  // errors propagate). Without `measureClock` nothing is collective and the offset is recorded
  // as not measured: for elastic jobs, whose later workers join a world already running.
  TraceSession(comm::Group& world, std::string dir, bool measureClock = true);
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // Writes what the sink holds now to path(), atomically (common/trace_file.h). SystemError.
  void write();

  const std::string& path() const { return path_; }
  const RankTraceInfo& info() const { return info_; }
  const std::shared_ptr<TraceSink>& sink() const { return sink_; }

 private:
  std::shared_ptr<TraceSink> sink_;
  std::string path_;
  RankTraceInfo info_;
  std::mutex writeMutex_;  // two writes at once would race on nothing but waste work
};

}  // namespace shoal::run
