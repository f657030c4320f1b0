// The step-time breakdown's parts (comm/operation_times.h): the split of blocked time into
// waiting and communication on known records, the log's bound, and the native engine's records
// of real operations on thread ranks (one per operation, on the thread that ran it, with an
// arrival no earlier than the peer's call).
#include "comm/operation_times.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "comm/collectives.h"
#include "comm/engine.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using comm::OperationTime;
using comm::TimeSpan;
using std::chrono::milliseconds;

// Times on a made-up axis: t(5) is 5 ms after an origin.
const Clock::time_point kOrigin = Clock::now();
Clock::time_point t(int ms) {
  return kOrigin + milliseconds(ms);
}

TEST(OperationTimes, BlockedTimeIsSplitAtEachOperationsFirstArrival) {
  const auto me = std::this_thread::get_id();
  const std::thread::id executor{};  // any other thread
  // On this thread: an operation that waited 0..3 and moved 3..5. On another thread, while this
  // one waited for it from 10 to 20: waiting 8..14 (begun before the wait), moving 14..20.
  const std::vector<OperationTime> ops = {{me, t(0), t(3), t(5)}, {executor, t(8), t(14), t(20)}};
  const std::vector<TimeSpan> waits = {{t(10), t(20)}};
  const auto b = comm::splitBlockedTime(ops, waits, me, {t(0), t(30)});
  EXPECT_NEAR(b.waitingSeconds, 0.003 + 0.004, 1e-9);
  EXPECT_NEAR(b.communicationSeconds, 0.002 + 0.006, 1e-9);
}

TEST(OperationTimes, OverlapsCountOnceAndOnlyTheWindowCounts) {
  const auto me = std::this_thread::get_id();
  const std::thread::id executor{};
  // Two overlapping waits (10..16, 14..20) are 10 ms blocked; the operation without an arrival
  // (a send) is moving all along; an operation on another thread outside any wait is hidden
  // behind compute, whatever it waited.
  const std::vector<OperationTime> ops = {{executor, t(10), Clock::time_point{}, t(20)},
                                          {executor, t(30), t(39), t(40)}};
  const std::vector<TimeSpan> waits = {{t(10), t(16)}, {t(14), t(20)}};
  auto b = comm::splitBlockedTime(ops, waits, me, {t(0), t(50)});
  EXPECT_NEAR(b.waitingSeconds, 0, 1e-12);
  EXPECT_NEAR(b.communicationSeconds, 0.010, 1e-9);
  // The window clips: only 15..18 of the wait is in it.
  b = comm::splitBlockedTime(ops, waits, me, {t(15), t(18)});
  EXPECT_NEAR(b.communicationSeconds, 0.003, 1e-9);
  // Nothing blocked: nothing to split.
  b = comm::splitBlockedTime(ops, {}, me, {t(0), t(50)});
  EXPECT_EQ(b.waitingSeconds, 0);
  EXPECT_EQ(b.communicationSeconds, 0);
}

TEST(OperationTimes, TheLogKeepsTheNewestAndTakesThemOnce) {
  comm::OperationTimeLog log(2);
  for (int i = 0; i < 3; ++i) log.add({{}, t(i), {}, t(i + 1)});
  EXPECT_EQ(log.dropped(), 1u);
  const auto taken = log.take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].start, t(1));
  EXPECT_EQ(taken[1].start, t(2));
  EXPECT_TRUE(log.take().empty());
}

TEST(OperationTimes, TheNativeEngineRecordsEachOperationItRuns) {
  // Rank 1 calls its all-reduce only after rank 0 said it is about to call its own: rank 0's
  // first arrival cannot come before rank 1's call (the message did not exist).
  std::atomic<bool> rank0Calling{false};
  std::atomic<int64_t> rank1CalledNs{0};
  std::mutex mutex;
  std::vector<std::vector<OperationTime>> records(2);
  std::vector<std::thread::id> threads(2);
  const auto errors = runThreadRanks(2, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
    auto log = std::make_shared<comm::OperationTimeLog>();
    g.engine().logOperationTimes(log);
    float x = 1;
    comm::allreduce(g, &x, 1, DataType::kFloat32, ReduceOp::kSum);  // both connected
    log->take();
    if (g.rank() == 0) {
      rank0Calling = true;
      rank0Calling.notify_all();
    } else {
      rank0Calling.wait(false);
      rank1CalledNs = Clock::now().time_since_epoch().count();
    }
    comm::allreduce(g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    comm::barrier(g);
    g.engine().logOperationTimes(nullptr);
    comm::barrier(g);  // not recorded
    std::lock_guard lock(mutex);
    records[g.rank()] = log->take();
    threads[g.rank()] = std::this_thread::get_id();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(records[r].size(), 2u) << "the all-reduce and the first barrier, rank " << r;
    for (const OperationTime& op : records[r]) {
      EXPECT_EQ(op.thread, threads[r]) << "run inline on the caller's thread";
      ASSERT_NE(op.firstArrival, Clock::time_point{}) << "both receive from the other";
      EXPECT_LE(op.start, op.firstArrival);
      EXPECT_LE(op.firstArrival, op.end);
    }
  }
  EXPECT_GE(records[0][0].firstArrival.time_since_epoch().count(), rank1CalledNs.load());
}

}  // namespace
}  // namespace shoal::test
