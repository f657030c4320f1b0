// Where a rank's time in communication went, as the engine sees it: waiting for its peers or
// moving data (README "Step-time breakdown"; the Trainer's compute / communication / waiting,
// train/trainer.h's StepInfo).
//
// An OperationTimeLog handed to an engine (Engine::logOperationTimes) gets one record per
// operation the engine runs in issue order (collectives; point-to-point where the engine runs it
// in order): the thread that ran it, when it started, when its first message from any peer
// arrived on this rank, and when it ended. The arrival is the split of Note [Operation spans]
// (comm/group.cpp): before it the operation waited for its peers; after it, it moved and reduced
// data (and waited for any peer it met only later: the split is a lower bound on waiting). An
// operation in which no message arrived (a send, the root of a broadcast, a group of one) has no
// arrival: nothing tells its waiting from its moving, and none is made up.
//
// splitBlockedTime then says, of the time a thread was blocked on communication in a window,
// how much was waiting and how much was moving data.
//
// Threading: OperationTimeLog is thread-safe (the engine adds from the thread running an
// operation, the training thread takes). splitBlockedTime is a pure function. Nothing blocks
// beyond the log's mutex.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/deadline.h"

namespace shoal::comm {

struct OperationTime {
  std::thread::id thread;          // the thread that ran it
  Clock::time_point start;         // it began running
  Clock::time_point firstArrival;  // its first message from a peer; {} when none arrived
  Clock::time_point end;           // it finished
};

// A span of time on the steady clock, begin <= end.
struct TimeSpan {
  Clock::time_point begin;
  Clock::time_point end;
};

class OperationTimeLog {
 public:
  // Keeps the newest `capacity` records not yet taken (at least 1): a log nobody takes from
  // stays bounded, and drops its oldest records.
  explicit OperationTimeLog(size_t capacity = kDefaultCapacity);

  static constexpr size_t kDefaultCapacity = 1 << 16;

  void add(const OperationTime& record);
  // The records added since the last take, oldest first.
  std::vector<OperationTime> take();
  // Records dropped for want of room since construction.
  size_t dropped() const;

 private:
  mutable std::mutex mutex_;
  std::deque<OperationTime> records_;
  size_t capacity_;
  size_t dropped_ = 0;
};

struct BlockedTime {
  double waitingSeconds = 0;        // blocked while the running operation awaited its peers
  double communicationSeconds = 0;  // the rest of the blocked time: moving data
};

// Of the time `thread` was blocked on communication within `window`, the waiting and the
// communication. The thread was blocked while it ran an operation itself (the records with its
// id), and during `waits`: spans in which it waited for operations that other threads ran (an
// executor running asynchronous work; the DDP reducer's wait at the end of backward). Of that
// blocked time (overlaps counted once), waiting is the part during which any operation of `ops`
// had started and not yet heard from a peer; communication is the rest.
BlockedTime splitBlockedTime(const std::vector<OperationTime>& ops,
                             const std::vector<TimeSpan>& waits, std::thread::id thread,
                             TimeSpan window);

}  // namespace shoal::comm
