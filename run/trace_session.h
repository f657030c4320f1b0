// The timeline of one rank's world, as shoal::init() sets it up under SHOAL_TRACE=DIR: the
// world group's trace sink, this rank's clock offset against rank 0 (measured at start, again
// at each resync() and once more at the end), and the file DIR/trace.rank<R>.json that the
// session writes when it goes (README "Timeline").
//
// Note [Clock resynchronisation]: clocks of different hosts drift apart (tens of ppm: a few ms
// an hour), so an offset measured at start-up goes stale over a long job. Every measurement is
// kept with the time it was taken, the file lists them all (common/trace_file.h), and the merge
// maps each span with the offset interpolated between the measurements around it
// (common/clock_map.h). A training loop calls resync() now and then (every rank at the same
// point), and the session measures once more before it writes its file at the end, so that
// every span lies between two measurements.
//
// Threading: write() may be called from any thread; resync() is collective (below). The
// destructor measures (when it safely can) and writes once more (the last copy of shoal::World
// going away), logging instead of throwing what fails.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/clock_sync.h"
#include "comm/group.h"
#include "common/trace_file.h"

namespace shoal::run {

// "trace.rank<R>.json": the name each rank's file has in the trace folder.
std::string rankTraceFileName(int rank);

// Measurements a session keeps: past this many, every other one between the first and the last
// is dropped (a job resyncing every step still has a bounded file, its measurements spread
// over the whole job).
inline constexpr size_t kMaxClockSamples = 4096;

class TraceSession {
 public:
  // Collective over `world` with `measureClock`, whose options carry the sink
  // (GroupOptions::trace, non-null): creates `dir` if missing (InvalidArgument naming it if it
  // cannot), then measures this rank's clock offset against rank 0 (comm/clock_sync.h; its
  // errors propagate). Without `measureClock` nothing is collective, not even resync(), and the
  // offset is recorded as not measured: for elastic jobs, whose later workers join a world
  // already running. The session keeps a weak reference to `world`: it does not keep the
  // group alive.
  TraceSession(const std::shared_ptr<comm::Group>& world, std::string dir,
               bool measureClock = true);
  // Measures a last time (see finish()), then writes; logs what fails instead of throwing.
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // Measures this rank's clock offset against rank 0 again and keeps it with the time it was
  // taken (Note [Clock resynchronisation]). Collective over the world group: every rank calls
  // it at the same point of its program, like a barrier, with none of its own point-to-point
  // traffic on the world group in flight (the measurement's messages are point-to-point, tag 0;
  // collectives of other threads are fine). Blocking: rank 0 plays 16 ping-pong rounds (small
  // messages) with each other rank in turn, so the call lasts ~16 x (size - 1) round trips.
  // Each message waits at most `timeout` (default: the group's). Returns the measurement, or
  // nullopt where the clock is not measured (elastic sessions: nothing is collective there). Throws
  // what comm::measureClockOffset throws (TimeoutError, PeerError naming the rank that failed,
  // ...): the measurement is not kept, the spans keep the earlier ones, and the session measures no
  // more (a failed exchange leaves the group unusable): later calls throw PeerError.
  // InvalidArgument if the world group is gone.
  std::optional<comm::ClockOffset> resync(std::optional<Duration> timeout = std::nullopt);

  // The interval form for a training loop: resync() when `step` is a positive multiple of
  // `everySteps` (every rank passes the same step and interval, so all measure at the same
  // call), nothing otherwise. Returns whether it measured. InvalidArgument if everySteps < 1.
  bool resyncEvery(int64_t step, int64_t everySteps,
                   std::optional<Duration> timeout = std::nullopt);

  // The end of the job's timeline: a last measurement, so that the last spans lie between two
  // (collective like resync(); the destructor calls it, so every rank's World should go at the
  // end of the job: one that goes early waits there for the others), then write(). Where it cannot
  // safely measure it only writes: an elastic session, an earlier measurement that failed, the
  // world group gone, or an exception unwinding the stack (a failing rank must not wait for peers
  // that may never come). A measurement that fails (a peer died or never came within
  // `timeout`, default the group's) is logged as a warning and skipped: the last spans are then
  // aligned by the last offset measured. Idempotent: once finished, later calls only write.
  // Throws only what write() throws.
  void finish(std::optional<Duration> timeout = std::nullopt);

  // Writes what the sink holds now, with the measurements so far, to path(), atomically
  // (common/trace_file.h). Not collective. SystemError.
  void write();

  const std::string& path() const { return path_; }
  // A copy: resync() may add to it meanwhile.
  RankTraceInfo info() const;
  const std::shared_ptr<TraceSink>& sink() const { return sink_; }

 private:
  // Measures and keeps the result; under callMutex_.
  comm::ClockOffset measure(comm::Group& world, std::optional<Duration> timeout);

  std::weak_ptr<comm::Group> world_;
  std::shared_ptr<TraceSink> sink_;
  std::string path_;
  std::mutex callMutex_;  // one measurement at a time; finished_ and broken_
  bool finished_ = false;
  bool broken_ = false;           // a measurement failed: the group is not to be used for more
  mutable std::mutex infoMutex_;  // info_, which write() reads from any thread
  RankTraceInfo info_;
  std::mutex writeMutex_;  // two writes at once would race on nothing but waste work
};

}  // namespace shoal::run
