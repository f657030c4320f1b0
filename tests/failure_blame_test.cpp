// The launcher's choice of the rank a failed job's summary blames (run/failure_blame.h), on
// made-up exits: waitpid statuses in Linux's encoding.
#include "run/failure_blame.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "common/error.h"

namespace shoal::test {
namespace {

using run::blameFailure;
using run::RankFailure;
using run::RankStop;
using Clock = std::chrono::steady_clock;

int exited(int code) {
  return code << 8;
}
int killedBy(int sig) {
  return sig;
}
Clock::time_point at(int ms) {
  return Clock::time_point() + std::chrono::milliseconds(ms);
}

TEST(FailureBlame, AmongExitsTheLowestRankWhateverTheOrderSeen) {
  const auto b = blameFailure(
      {{3, exited(1), true, at(10)}, {1, exited(1), true, at(20)}, {2, exited(2), true, at(5)}},
      {});
  EXPECT_EQ(b.firstFailed, 1u);
  EXPECT_FALSE(b.stopped);
}

// Its peers fail because it vanished: a killed rank is the cause, even if a lower rank exited
// first.
TEST(FailureBlame, AKilledRankComesBeforeRanksThatExited) {
  const auto b =
      blameFailure({{0, exited(1), true, at(1)}, {3, killedBy(SIGKILL), true, at(9)}}, {});
  EXPECT_EQ(b.firstFailed, 1u);
}

// ssh reports a remote rank killed by signal N as exit code 128 + N; a local rank's own exit
// code 137 is only an exit code.
// Rank 2 failed by itself (an exception in its own code): rank 0's abort record names it. Both
// exited; rank 0 is lower but was the victim.
TEST(FailureBlame, ARankWhoseRecordNamesAnotherFailedRankIsAVictim) {
  const auto b = blameFailure(
      {{0, exited(1), true, at(1), /*cause=*/2}, {2, exited(1), true, at(3), /*cause=*/-1}}, {});
  EXPECT_EQ(b.firstFailed, 1u);
  // Its own record naming itself (its own timeout) makes it no victim.
  const auto self = blameFailure(
      {{0, exited(1), true, at(1), /*cause=*/0}, {2, exited(1), true, at(3), /*cause=*/0}}, {});
  EXPECT_EQ(self.firstFailed, 0u);
  // A cause that did not fail (still running when the window closed) changes nothing.
  const auto running = blameFailure(
      {{1, exited(1), true, at(1), /*cause=*/3}, {2, exited(1), true, at(3), /*cause=*/3}}, {});
  EXPECT_EQ(running.firstFailed, 0u);
  // Every one a victim of another (records that disagree): the lowest rank, as without them.
  const auto all = blameFailure(
      {{4, exited(1), true, at(1), /*cause=*/1}, {1, exited(1), true, at(3), /*cause=*/4}}, {});
  EXPECT_EQ(all.firstFailed, 1u);
  // A killed rank still comes first.
  const auto killed = blameFailure(
      {{0, exited(1), true, at(1), /*cause=*/-1}, {3, killedBy(SIGKILL), true, at(9), 0}}, {});
  EXPECT_EQ(killed.firstFailed, 1u);
}

TEST(FailureBlame, ARemoteExitAbove128IsASignalALocalOneIsNot) {
  EXPECT_EQ(
      blameFailure({{0, exited(1), false, at(1)}, {2, exited(137), false, at(2)}}, {}).firstFailed,
      1u);
  EXPECT_EQ(
      blameFailure({{0, exited(1), true, at(1)}, {2, exited(137), true, at(2)}}, {}).firstFailed,
      0u);
}

// Note [Stopped ranks]: the peers of a stopped rank time out; the rank stopped before the
// first failure is blamed, the earliest stopped if several; one stopped after it is not.
TEST(FailureBlame, ARankStoppedBeforeTheFirstFailureIsBlamedInstead) {
  const std::vector<RankFailure> failures{{0, exited(1), true, at(500)},
                                          {1, exited(1), true, at(400)}};
  auto b = blameFailure(failures, {{3, at(450)}, {2, at(100)}, {5, at(50)}});
  EXPECT_EQ(b.firstFailed, 0u);
  ASSERT_TRUE(b.stopped);
  EXPECT_EQ(*b.stopped, 2u);  // rank 5, stopped at 50 ms
  b = blameFailure(failures, {{3, at(450)}});
  EXPECT_FALSE(b.stopped);  // stopped after rank 1 failed at 400 ms: not the cause
  b = blameFailure(failures, {{3, at(400)}});
  ASSERT_TRUE(b.stopped);  // at the same instant: blamed
}

TEST(FailureBlame, NoFailureIsRefused) {
  EXPECT_THROW(blameFailure({}, {{1, at(1)}}), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
