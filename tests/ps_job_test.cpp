// Parameter servers: whole jobs of real server and worker processes under `shoal run --servers`
// (tests/ps_worker.cpp): concurrent pushes, staleness, bad requests, pushes applied as they
// arrive, failures (a server that cannot write, a killed server, a failed worker), and
// checkpoints resumed under another number of servers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "tests/process_util.h"
#include "tests/ps_job_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

TEST(PsJob, NoUpdateIsLostUnderSixteenWorkersPushingConcurrently) {
  TempDir dir;
  auto r = psJob({"-n", "16", "--servers", "2"}, {"sums", "--pushes", "2000"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(workersSaying(r.output, 16, "sums exact over 20097 elements after 2000 pushes"), 16)
      << r.output;
  EXPECT_EQ(r.output.find("WRONG"), std::string::npos) << r.output;
}

int largestLead(const std::string& output, int workers) {
  int most = -1;
  std::regex lead(R"(\[(\d+)\] lead max (\d+))");
  for (std::sregex_iterator it(output.begin(), output.end(), lead), end; it != end; ++it) {
    if (std::stoi((*it)[1]) < workers) most = std::max(most, std::stoi((*it)[2]));
  }
  return most;
}

TEST(PsJob, StalenessBoundHoldsWithASlowWorker) {
  TempDir dir;
  auto r = psJob({"-n", "4", "--servers", "2"},
                 {"staleness", "--mode", "ssp", "--staleness", "2", "--steps", "40"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  // Bounded, and the bound was reached (the fast workers did wait on the slow one).
  EXPECT_EQ(largestLead(r.output, 4), 2) << r.output;
  EXPECT_EQ(workersSaying(r.output, 4, "lead max"), 4) << r.output;
  // Without the bound the same job runs far ahead: the bound is what held it.
  TempDir free;
  auto a = psJob({"-n", "4", "--servers", "2"},
                 {"staleness", "--mode", "async", "--staleness", "0", "--steps", "40"}, free);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_GT(largestLead(a.output, 4), 5) << a.output;
}

TEST(PsJob, AWrongShapeOrDtypeIsRefusedAndTheServerKeepsServing) {
  TempDir dir;
  auto r = psJob({"-n", "3", "--servers", "2"}, {"reject"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(workersSaying(r.output, 3, "reject ok"), 3) << r.output;
  EXPECT_NE(r.output.find("refused as expected: parameter server 0 refused the push: worker 1: "
                          "push step 2: key 'w' is float32 [4, 5]; got float32 [5, 4]"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("got float64 [4, 5]"), std::string::npos) << r.output;
}

// Note [Update from the ring], end to end: servers apply every push as it arrives (the
// last worker's of a synchronous step, every asynchronous one) and must hold, bit for bit, what
// the reference kernels compute. A 4 KiB shared-memory ring cuts every payload into many pieces
// starting anywhere in the ring; TCP cuts them differently.
TEST(PsJob, PushesAppliedAsTheyArriveMatchTheReferenceOptimizerBitForBit) {
  struct Job {
    int workers;
    const char* mode;
    const char* optimizer;
    const char* transport;
  };
  const std::vector<Job> jobs{
      {1, "sync", "sgd", "shm"},      {3, "sync", "momentum", "shm"}, {2, "sync", "adam", "shm"},
      {2, "sync", "rmsprop", "tcp"},  {3, "async", "adam", "shm"},    {2, "ssp", "momentum", "shm"},
      {2, "async", "rmsprop", "tcp"}, {3, "sync", "adam", "tcp"},
  };
  for (const Job& j : jobs) {
    const std::string what =
        fmt::format("{} workers, {}, {}, {}", j.workers, j.mode, j.optimizer, j.transport);
    SCOPED_TRACE(what);
    TempDir dir;
    auto r =
        psJob({"-n", std::to_string(j.workers), "--servers", "2", "-x", "SHOAL_SHM_RING_BYTES=4096",
               "-x", fmt::format("SHOAL_TRANSPORT={}", j.transport)},
              {"reference", "--mode", j.mode, "--optimizer", j.optimizer, "--steps", "8"}, dir);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(
        workersSaying(r.output, j.workers, "reference exact over 7123 elements after 8 steps"),
        j.workers)
        << r.output;
    // The paths under test did run, on both servers: every asynchronous push and some
    // synchronous ones (those that complete a step) applied as they arrived; push-pulls
    // answered while applied (Note [Streamed push-pull]) wherever that is decided up front.
    std::regex line(
        R"(server (\d+): (\d+) pushes \((\d+) applied on arrival\), \d+ pulls \((\d+) streamed\))");
    int servers = 0;
    const bool async = std::string(j.mode) != "sync";
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
      ++servers;
      const int pushes = std::stoi((*it)[2]), direct = std::stoi((*it)[3]);
      const int streamed = std::stoi((*it)[4]);
      EXPECT_GT(direct, 0) << it->str();
      if (async) {
        EXPECT_EQ(direct, pushes) << it->str();
      }
      if (async || j.workers == 1) {
        EXPECT_GT(streamed, 0) << it->str();
      }
    }
    EXPECT_EQ(servers, 2) << r.output;
  }
}

// Before, a server whose own checkpoint write failed said "worker w failed" (the worker whose
// push triggered the write).
TEST(PsJob, AServerThatCannotWriteItsCheckpointBlamesItselfNotAWorker) {
  TempDir dir;
  // A folder where server 1's step-5 checkpoint file must go: the rename onto it fails.
  std::filesystem::create_directories(dir.path + "/checkpoints/server-1/shard-00000005.bin/x");
  auto r = psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", dir.path}, dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("parameter server 1: writing the checkpoint of step 5 failed"),
            std::string::npos)
      << r.output;
  // Server 1 blames itself. (Server 0 may say that a worker failed: the workers leave it once
  // server 1 failed them.)
  EXPECT_NE(r.output.find("parameter server 1 stopped: parameter server 1: writing"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("parameter server 1 stopped: worker"), std::string::npos) << r.output;
}

TEST(PsJob, AKilledServerFailsTheWorkersFastAndResumeFinishesExactly) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto killed = psJob({"-n", "2", "--servers", "2"},
                      {"train", "--dir", dir.path, "--kill-server-at", "12"}, dir);
  EXPECT_NE(killed.code, 0) << killed.output;
  EXPECT_LT(killed.seconds, 40) << killed.output;
  // The launcher names the dead server's rank as the cause. It stops the other ranks at once
  // (run/launcher.h), so a worker may be stopped before it reports what it saw: at least one
  // worker names the dead server, and every worker that reports an error names it.
  EXPECT_NE(killed.output.find("rank 3 (host localhost, pid "), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("failed first: killed by signal 9"), std::string::npos)
      << killed.output;
  const int naming =
      workersSaying(killed.output, 2, "ERROR PeerError: parameter server 1: push-pull step");
  EXPECT_GE(naming, 1) << killed.output;
  EXPECT_EQ(workersSaying(killed.output, 2, "ERROR"), naming) << killed.output;

  auto resumed =
      psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", dir.path, "--resume"}, dir);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(step 10)"), std::string::npos) << resumed.output;
  EXPECT_EQ(workersSaying(resumed.output, 2, "resumes at step 10"), 2) << resumed.output;
  EXPECT_EQ(finalDigest(resumed.output), expected) << resumed.output;
}

// Top-k and 1-bit pushes hold back what they did not send (error feedback, ps/payload_codec.h).
// Each worker saves that beside the servers' checkpoints (ps/residual_checkpoint.h), so a job
// resumed after a server died ends where an uninterrupted one does. Before, the resumed workers
// started from zero residuals: the run below without the files shows what that changes.
TEST(PsJob, CompressedTrainingResumesExactlyWithEachWorkersResiduals) {
  for (const std::string codec : {"topk:0.05", "onebit"}) {
    SCOPED_TRACE(codec);
    const std::string expected = uninterruptedTrainDigest({"--compression", codec});
    ASSERT_FALSE(expected.empty());
    EXPECT_NE(expected, uninterruptedTrainDigest()) << "the compression changed nothing";

    // Server 1 dies after step 12: the servers resume from their checkpoint of step 10, the
    // workers from the residuals they saved while pushing step 9.
    TempDir dir;
    auto killed =
        psJob({"-n", "2", "--servers", "2"},
              {"train", "--dir", dir.path, "--compression", codec, "--kill-server-at", "12"}, dir);
    EXPECT_NE(killed.code, 0) << killed.output;
    for (int w = 0; w < 2; ++w) {
      EXPECT_TRUE(std::filesystem::exists(
          fmt::format("{}/checkpoints/worker-{}/residual-00000010.bin", dir.path, w)));
    }
    // The same checkpoints without the workers' files, for the run that shows they matter.
    TempDir bare;
    std::filesystem::copy(dir.path + "/checkpoints", bare.path + "/checkpoints",
                          std::filesystem::copy_options::recursive);
    for (int w = 0; w < 2; ++w) {
      std::filesystem::remove_all(fmt::format("{}/checkpoints/worker-{}", bare.path, w));
    }

    auto resumed = psJob({"-n", "2", "--servers", "2"},
                         {"train", "--dir", dir.path, "--compression", codec, "--resume"}, dir);
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    EXPECT_EQ(workersSaying(resumed.output, 2, "resumes at step 10"), 2) << resumed.output;
    EXPECT_EQ(resumed.output.find("residuals start from zero"), std::string::npos)
        << resumed.output;
    EXPECT_EQ(finalDigest(resumed.output), expected) << resumed.output;

    auto withoutResiduals =
        psJob({"-n", "2", "--servers", "2"},
              {"train", "--dir", bare.path, "--compression", codec, "--resume"}, bare);
    ASSERT_EQ(withoutResiduals.code, 0) << withoutResiduals.output;
    EXPECT_EQ(workersSaying(withoutResiduals.output, 2,
                            "no error-feedback residuals for step 10 in " + bare.path +
                                "/checkpoints/worker-"),
              2)
        << withoutResiduals.output;
    EXPECT_NE(finalDigest(withoutResiduals.output), expected) << withoutResiduals.output;
  }
}

// A worker that fails leaves instead of saying goodbye (ps/client.h): the servers stop and tell
// the other worker at once, naming it. Before, its goodbye told the servers it was done, and
// the other worker's next synchronous step waited for its push until the timeout (the launcher
// stopped that worker before it could say why).
TEST(PsJob, AWorkerThatFailsStopsTheOtherAtOnceNamingIt) {
  TempDir dir;
  auto r = psJob({"-n", "2", "--servers", "2"},
                 {"train", "--dir", dir.path, "--fail-worker-at", "6"}, dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_EQ(workersSaying(r.output, 2, "ERROR Error: worker 1 fails on purpose after step 6"), 1)
      << r.output;
  EXPECT_NE(r.output.find("[0] ERROR PeerError: parameter server "), std::string::npos) << r.output;
  EXPECT_EQ(workersSaying(r.output, 1, "push-pull step 7 from worker 0 failed"), 1) << r.output;
  EXPECT_EQ(workersSaying(r.output, 1, "stopped: worker 1 failed"), 1) << r.output;
}

// Note [Resharding checkpoints]: a checkpoint written by one number of servers resumes under
// another, exactly (synchronous training gives the same values whatever the partition).
TEST(PsJob, ACheckpointOfTwoServersResumesOnThreeExactly) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto first =
      psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", dir.path, "--steps", "12"}, dir);
  ASSERT_EQ(first.code, 0) << first.output;
  auto resumed =
      psJob({"-n", "2", "--servers", "3"}, {"train", "--dir", dir.path, "--resume"}, dir);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoints of 2 servers in " + dir.path +
                                "/checkpoints, resharded (step 12)"),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(workersSaying(resumed.output, 2, "resumes at step 12"), 2) << resumed.output;
  EXPECT_EQ(finalDigest(resumed.output), expected) << resumed.output;
}

// 3 -> 2 -> 3: after the second job, server-2's folder is stale (step 12, written by 3 servers)
// while servers 0 and 1 hold step 20 of 2 servers; the third job must resume from step 20.
TEST(PsJob, ACheckpointOfThreeServersResumesOnTwoAndStaleFoldersAreIgnored) {
  const std::string expected = uninterruptedTrainDigest();
  ASSERT_FALSE(expected.empty());

  TempDir dir;
  auto first =
      psJob({"-n", "2", "--servers", "3"}, {"train", "--dir", dir.path, "--steps", "12"}, dir);
  ASSERT_EQ(first.code, 0) << first.output;
  auto second = psJob({"-n", "2", "--servers", "2"},
                      {"train", "--dir", dir.path, "--steps", "20", "--resume"}, dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("checkpoints of 3 servers in " + dir.path +
                               "/checkpoints, resharded (step 12)"),
            std::string::npos)
      << second.output;
  ASSERT_TRUE(std::filesystem::exists(dir.path + "/checkpoints/server-2/shard-00000012.bin"));
  auto third = psJob({"-n", "2", "--servers", "3"}, {"train", "--dir", dir.path, "--resume"}, dir);
  ASSERT_EQ(third.code, 0) << third.output;
  EXPECT_NE(third.output.find("checkpoints of 2 servers in " + dir.path +
                              "/checkpoints, resharded (step 20)"),
            std::string::npos)
      << third.output;
  EXPECT_EQ(workersSaying(third.output, 2, "resumes at step 20"), 2) << third.output;
  EXPECT_EQ(finalDigest(third.output), expected) << third.output;
}

TEST(PsJob, ACorruptOldServerFileFailsAReshardingResumeNamingIt) {
  TempDir dir;
  auto first =
      psJob({"-n", "2", "--servers", "2"}, {"train", "--dir", dir.path, "--steps", "12"}, dir);
  ASSERT_EQ(first.code, 0) << first.output;
  const std::string file = dir.path + "/checkpoints/server-1/shard-00000012.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(file) / 2);
    f.seekg(middle);
    const char c = static_cast<char>(f.get());
    f.seekp(middle);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  auto resumed =
      psJob({"-n", "2", "--servers", "3"}, {"train", "--dir", dir.path, "--resume"}, dir);
  EXPECT_NE(resumed.code, 0) << resumed.output;
  EXPECT_LT(resumed.seconds, 60) << resumed.output;
  EXPECT_NE(resumed.output.find("written by server 1 of 2 cannot be restored"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find(file), std::string::npos) << resumed.output;
}

}  // namespace
}  // namespace shoal::test
