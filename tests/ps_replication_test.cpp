// Replicated parameter-server shards (Note [Replicated shards] in ps/server.h): real server and
// worker processes under `shoal run --servers K --ps-replicas 2`, a server SIGKILLed mid-run.
#include <gtest/gtest.h>

#include <string>

#include "tests/process_util.h"
#include "tests/ps_job_util.h"

namespace shoal::test {
namespace {

// Synchronous training must not notice the loss: the backup applied every step the primary
// did, bit for bit, so the job ends with the digest of a run that lost nothing (and of a run
// without replicas: the replicas change where the values live, not what they are).
TEST(PsReplication, ASynchronousJobThatLosesAServerEndsBitwiseAsAnUninterruptedOne) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto killed = psJob({"-n", "2", "--servers", "2", "--ps-replicas", "2"},
                      {"train", "--dir", dir.path, "--kill-server-at", "12"}, dir);
  ASSERT_EQ(killed.code, 0) << killed.output;
  EXPECT_NE(killed.output.find("killing parameter server 1"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find(
                "parameter server 1 (rank 3) killed by signal 9 (Killed); the workers go on "
                "with its shard's backup on server 0"),
            std::string::npos)
      << killed.output;
  EXPECT_EQ(finalDigest(killed.output), expected) << killed.output;
  // Server 1 held shard 1's primary and shard 0's backup: each worker let both go.
  EXPECT_EQ(workersSaying(killed.output, 2, "failovers 2"), 2) << killed.output;
  EXPECT_EQ(workersSaying(killed.output, 2, "shard 1 continues on its backup on server 0"), 2)
      << killed.output;
}

// Asynchronous mode: every push a worker saw complete was applied by two servers, so none is
// lost with one of them: the sums over all pushes are exact (lr 1, integer gradients).
TEST(PsReplication, AnAsynchronousJobThatLosesAServerLosesNoAcknowledgedUpdate) {
  TempDir dir;
  auto r = psJob({"-n", "4", "--servers", "3", "--ps-replicas", "2"},
                 {"sums", "--pushes", "600", "--dir", dir.path, "--kill-server-at", "200"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("killing parameter server 1 (pid"), std::string::npos) << r.output;
  EXPECT_EQ(workersSaying(r.output, 4, "sums exact over 20097 elements after 600 pushes"), 4)
      << r.output;
  EXPECT_EQ(r.output.find("WRONG"), std::string::npos) << r.output;
  EXPECT_EQ(workersSaying(r.output, 4, "failovers 2"), 4) << r.output;
}

// Servers 1 and 2 hold both copies of shard 1 (its backup lives on server 2): the job cannot go
// on, and every worker says which shard was lost and where, within the timeout.
TEST(PsReplication, LosingBothCopiesOfAShardFailsTheWorkersNamingIt) {
  TempDir dir;
  auto r = psJob({"-n", "2", "--servers", "3", "--ps-replicas", "2"},
                 {"sums", "--pushes", "600", "--dir", dir.path, "--kill-server-at", "100",
                  "--kill-servers", "1,2"},
                 dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
  // The first worker to fail stops the job (run/launcher.h), so the other may be stopped before
  // it reports: at least one reports, and every report is this one.
  const int naming = workersSaying(r.output, 2, "ERROR PeerError: worker");
  EXPECT_GE(naming, 1) << r.output;
  EXPECT_EQ(workersSaying(r.output, 2, "ERROR"), naming) << r.output;
  EXPECT_NE(r.output.find("shard 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lost both copies"), std::string::npos) << r.output;
}

// Without losses, the replicated job is the plain one: every server also reports the backup
// it kept, which applied every push.
TEST(PsReplication, EveryServerKeepsABackupThatAppliesEveryPush) {
  TempDir dir;
  auto r = psJob({"-n", "2", "--servers", "3", "--ps-replicas", "2"},
                 {"train", "--dir", dir.path, "--steps", "10"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (int s = 0; s < 3; ++s) {
    EXPECT_NE(r.output.find("server " + std::to_string(s) +
                            "'s backup: 20 pushes, 0 pulls, final step 10"),
              std::string::npos)
        << s << "\n"
        << r.output;
  }
  EXPECT_EQ(workersSaying(r.output, 2, "failovers 0"), 2) << r.output;
}

// Note [Replacement servers] (ps/replacement.h): server 1 is killed and started again; its
// replacement takes shard 1's primary and shard 0's backup back from server 0 at a step
// boundary, and the workers use it again. Then server 0 is killed: the job can go on only if
// the replacement holds both shards, and it ends bitwise as an uninterrupted run only if it
// holds them exactly.
TEST(PsReplacement, AReplacementTakesItsShardsBackAndTheJobThenSurvivesLosingTheOtherServer) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto r = psJob({"-n", "2", "--servers", "2", "--ps-replicas", "2", "--ps-replacements", "1"},
                 {"train", "--dir", dir.path, "--kill-server-at", "8", "--await-replacement",
                  "--kill-again-at", "20", "--kill-again", "0"},
                 dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("parameter server 1 (rank 3) killed by signal 9 (Killed); the workers "
                          "go on with its shard's backup on server 0; starting a replacement (1 "
                          "of 1)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replacement 1 took shard 1's primary over at step"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replacement 1 took shard 0's backup over at step"), std::string::npos)
      << r.output;
  EXPECT_EQ(workersSaying(r.output, 2, "shard 1's primary is back on server 1 (replacement 1)"), 2)
      << r.output;
  EXPECT_EQ(workersSaying(r.output, 2, "shard 0's backup is back on server 1 (replacement 1)"), 2)
      << r.output;
  // The budget is spent: server 0 stays lost, and the replacement carries both shards.
  EXPECT_NE(r.output.find("parameter server 0 (rank 2) killed by signal 9 (Killed); the workers "
                          "go on with its shard's backup on server 1\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(finalDigest(r.output), expected) << r.output;
}

// A replacement that starts as the job ends (server 1 killed after the last step) is told so by
// the surviving copies and ends at once: the job neither waits for it nor fails.
TEST(PsReplacement, AReplacementStartedAsTheJobEndsServesNothingAndTheJobEnds) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto r =
      psJob({"-n", "2", "--servers", "2", "--ps-replicas", "2", "--ps-replacements", "1"},
            {"train", "--dir", dir.path, "--kill-server-at", "29", "--await-replacement"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
  EXPECT_NE(r.output.find("server 1: its replacement served nothing (the job ended first)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(finalDigest(r.output), expected) << r.output;
}

TEST(PsReplication, TheLauncherRefusesReplicasItCannotPlace) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"-n", "2", "--servers", "1", "--ps-replicas", "2"},
       "--ps-replicas 2 needs --servers 2 or more (got 1)"},
      {{"-n", "2", "--servers", "2", "--ps-replicas", "3"}, "--ps-replicas"},
      {{"-n", "2", "--servers", "2", "--ps-replacements", "1"},
       "--ps-replacements needs --ps-replicas 2"},
      {{"-n", "2", "--servers", "2", "--ps-replicas", "2", "--ps-replacements", "-1"},
       "--ps-replacements"},
  };
  for (const auto& [launch, expected] : cases) {
    TempDir dir;
    auto r = psJob(launch, {"sums"}, dir);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace shoal::test
