// The launcher's policy for lost parameter servers of a replicated job (run/server_loss.h).
#include "run/server_loss.h"

#include <gtest/gtest.h>

namespace shoal::test {
namespace {

using run::ServerLossPolicy;

// 4 workers (ranks 0-3), then 3 servers (ranks 4-6): server s holds shard s and shard s-1's
// backup, around the ring.
constexpr int kWorkers = 4, kServers = 3;

TEST(ServerLoss, WorkersAndUnreplicatedJobsAreNotItsBusiness) {
  ServerLossPolicy unreplicated(kWorkers, kServers, 1, 0);
  EXPECT_FALSE(unreplicated.failed(4));
  ServerLossPolicy replicated(kWorkers, kServers, 2, 1);
  for (int worker = 0; worker < kWorkers; ++worker) EXPECT_FALSE(replicated.failed(worker));
  EXPECT_FALSE(replicated.failed(kWorkers + kServers));  // no such rank
}

TEST(ServerLoss, ALoneLossIsToleratedAndNamesTheServerWithTheBackup) {
  ServerLossPolicy p(kWorkers, kServers, 2, 0);
  const auto v = p.failed(5);  // server 1: its shard's backup is on server 2
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->tolerated);
  EXPECT_FALSE(v->bothCopiesLost);
  EXPECT_EQ(v->replacement, 0);
  EXPECT_EQ(v->message, "the workers go on with its shard's backup on server 2");
  EXPECT_EQ(p.replacementOf(5), 0);
}

TEST(ServerLoss, ANeighbourLostBeforeMeansAShardLostBothCopies) {
  ServerLossPolicy p(kWorkers, kServers, 2, 0);
  ASSERT_TRUE(p.failed(5));    // server 1
  const auto v = p.failed(6);  // server 2: shard 1's backup was here
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->bothCopiesLost);
  EXPECT_EQ(v->replacement, 0);
  EXPECT_EQ(v->message,
            "server 1 failed before it: a shard lost both copies, the workers will fail");
  // Around the ring: server 0's previous neighbour is server 2.
  ServerLossPolicy q(kWorkers, kServers, 2, 0);
  ASSERT_TRUE(q.failed(6));
  EXPECT_TRUE(q.failed(4)->bothCopiesLost);
}

TEST(ServerLoss, ReplacementsAreNumberedBoundedAndMakeTheServerPresentAgain) {
  ServerLossPolicy p(kWorkers, kServers, 2, 2);
  auto v = p.failed(5);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->replacement, 1);
  EXPECT_EQ(v->message,
            "the workers go on with its shard's backup on server 2; starting a replacement (1 of "
            "2)");
  EXPECT_EQ(p.replacementOf(5), 1);
  // Until its replacement starts, server 1 is lost: its neighbour's loss costs a shard.
  ServerLossPolicy early(kWorkers, kServers, 2, 2);
  ASSERT_TRUE(early.failed(5));
  EXPECT_TRUE(early.failed(6)->bothCopiesLost);
  // Once it started, server 2's loss is a lone one again, and gets the second replacement.
  p.replacementStarted(5);
  v = p.failed(6);
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->bothCopiesLost);
  EXPECT_EQ(v->replacement, 2);
  EXPECT_EQ(p.replacementOf(6), 2);
  p.replacementStarted(6);
  // The replacement itself can be lost; no replacements are left for it.
  v = p.failed(5);
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->bothCopiesLost);
  EXPECT_EQ(v->replacement, 0);
  EXPECT_EQ(p.replacementOf(5), 1);  // the number its (lost) process had
}

}  // namespace
}  // namespace shoal::test
