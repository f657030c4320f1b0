// Real processes over real sockets and shared memory: the collective matrix, fault injection
// (SIGKILL and SIGSTOP of one rank in the middle of each collective), mismatched calls and a
// rank with the wrong secret. Every job runs under a deadline: a hang fails the test.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "run/local_job.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

std::string workerPath() {
  return std::string(SHOAL_TEST_WORKER);
}

run::LocalJobOptions job(int n, std::vector<std::string> args, const TempDir& dir,
                         std::vector<std::pair<std::string, std::string>> env = {}) {
  run::LocalJobOptions o;
  o.ranks = n;
  o.argv = {workerPath()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = std::move(env);
  o.outputDir = dir.path;
  return o;
}

std::string allOutput(const run::LocalJob& j, int n) {
  std::string s;
  for (int r = 0; r < n; ++r) s += fmt::format("--- rank {}:\n{}", r, j.output(r));
  return s;
}

class ProcessMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ProcessMatrix, EveryCollectiveMatchesTheReference) {
  const auto [transport, n] = GetParam();
  TempDir dir;
  run::LocalJob j(job(n, {"matrix"}, dir, {{"SHOAL_TRANSPORT", transport}}));
  bool timedOut = false;
  auto exits = j.wait(300s, &timedOut);
  ASSERT_FALSE(timedOut) << allOutput(j, n);
  for (auto& e : exits) EXPECT_TRUE(e.ok()) << e.describe() << "\n" << allOutput(j, n);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(j.output(r).find("matrix done"), std::string::npos) << j.output(r);
    EXPECT_NE(j.output(r).find(", 0 failures"), std::string::npos) << j.output(r);
  }
  if (n > 1) {
    EXPECT_NE(j.output(0).find("over " + transport), std::string::npos) << j.output(0);
  }
  std::printf("%s", j.output(0).c_str());
}

INSTANTIATE_TEST_SUITE_P(, ProcessMatrix,
                         ::testing::Combine(::testing::Values("tcp", "shm"),
                                            ::testing::Values(2, 3, 4)));

// --- Fault injection

struct FaultCase {
  std::string collective;
  int signal;
  std::string transport;
  int victim = 2;
};

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << c.collective << (c.signal == SIGKILL ? " SIGKILL " : " SIGSTOP ") << c.transport
      << " victim " << c.victim;
}

class FaultInjection : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultInjection, EverySurvivorFailsNamingTheVictimBeforeTheDeadline) {
  const auto& c = GetParam();
  constexpr int n = 4;
  const int victim = c.victim;
  constexpr double timeout = 4.0;
  const auto shmBefore = shmEntries();
  TempDir dir;
  // "tls": TCP links in TLS (abort frames travel inside the records).
  const bool tls = c.transport == "tls";
  run::LocalJob j(job(n, {"loop", c.collective}, dir,
                      {{"SHOAL_TIMEOUT", fmt::format("{}", timeout)},
                       {"SHOAL_TRANSPORT", tls ? "tcp" : c.transport},
                       {"SHOAL_ENCRYPT", tls ? "1" : "auto"}}));
  // Wait until every rank is inside the loop.
  Deadline ready(60s);
  for (int r = 0; r < n; ++r) {
    while (j.output(r).find("ready") == std::string::npos) {
      ASSERT_FALSE(ready.expired()) << "ranks never became ready\n" << allOutput(j, n);
      std::this_thread::sleep_for(5ms);
    }
  }
  j.signal(victim, c.signal);
  auto t0 = Clock::now();
  // Survivors must be done within the collective deadline (plus slack); waiting longer than
  // that means one hung. A stopped victim never exits by itself: it is not waited for.
  std::vector<run::RankExit> exits(n);
  Deadline hang(seconds(timeout + 20));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    std::optional<run::RankExit> e;
    while (!(e = j.poll(r))) {
      ASSERT_FALSE(hang.expired()) << "rank " << r << " hung\n" << allOutput(j, n);
      std::this_thread::sleep_for(5ms);
    }
    exits[r] = *e;
  }
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    std::string out = j.output(r);
    EXPECT_EQ(exits[r].exitCode, 3) << exits[r].describe() << "\n" << out;
    EXPECT_NE(out.find("ERROR"), std::string::npos) << out;
    // Every survivor names the victim as the cause, never the peer it heard it from.
    EXPECT_NE(out.find(fmt::format("(cause: rank {})", victim)), std::string::npos)
        << "rank " << r << " does not name rank " << victim << " as the cause:\n"
        << out;
    EXPECT_NE(out.find(fmt::format("CAUSE {}\n", victim)), std::string::npos) << out;
    EXPECT_NE(out.find("#"), std::string::npos) << "no operation sequence number:\n" << out;
  }
  EXPECT_LT(took, timeout + 5) << allOutput(j, n);
  EXPECT_EQ(shmEntries(), shmBefore) << "files left in /dev/shm";
}

std::vector<FaultCase> faultCases() {
  std::vector<FaultCase> cases;
  for (const char* coll :
       {"allreduce_ring", "allreduce_recursive_doubling", "allreduce_rabenseifner",
        "allreduce_driver", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
        "gather", "scatter", "barrier", "sendrecv"}) {
    for (int sig : {SIGKILL, SIGSTOP}) cases.push_back({coll, sig, "shm"});
  }
  cases.push_back({"allreduce_ring", SIGKILL, "tcp"});
  cases.push_back({"allreduce_ring", SIGSTOP, "tcp"});
  cases.push_back({"alltoall", SIGKILL, "tcp"});
  cases.push_back({"alltoall", SIGKILL, "tcp", 0});
  cases.push_back({"allreduce_recursive_doubling", SIGKILL, "tcp", 0});
  cases.push_back({"broadcast", SIGKILL, "shm", 0});
  cases.push_back({"allgather", SIGSTOP, "tcp", 0});
  cases.push_back({"allreduce_ring", SIGKILL, "tls"});
  cases.push_back({"allreduce_ring", SIGSTOP, "tls"});
  cases.push_back({"alltoall", SIGKILL, "tls", 0});
  cases.push_back({"sendrecv", SIGKILL, "tls"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, FaultInjection, ::testing::ValuesIn(faultCases()),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return info.param.collective + "_" +
                                  (info.param.signal == SIGKILL ? "kill" : "stop") + "_" +
                                  info.param.transport +
                                  (info.param.victim == 2
                                       ? std::string()
                                       : "_victim" + std::to_string(info.param.victim));
                         });

// The deadline holds when the rank that hosts the store stops (as under mpirun, Slurm or
// Kubernetes, where rank 0 hosts it): a timeout report asks the store where the others are,
// and that must not add more than its small budget. Before, survivors exited 10-11 s after a
// 5 s timeout.
TEST(StoreHost, SurvivorsFailWithinTheDeadlineWhenTheStoreHostStops) {
  constexpr int n = 4;
  constexpr double timeout = 3.0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    // Kubernetes-style rendezvous: rank 0 hosts the store on MASTER_PORT. That port is fixed
    // by the launcher's convention, so a busy one is retried with another.
    std::random_device rd;
    const int port = std::uniform_int_distribution<int>(20000, 39999)(rd);
    TempDir dir;
    auto o = job(n, {"loop", "allreduce_ring"}, dir,
                 {{"SHOAL_TIMEOUT", fmt::format("{}", timeout)}, {"SHOAL_TRANSPORT", "shm"}});
    o.shoalVariables = false;
    o.rankEnv = [&](int r) {
      return std::vector<std::pair<std::string, std::string>>{
          {"JOB_COMPLETION_INDEX", std::to_string(r)},
          {"HOSTNAME", fmt::format("store-host-test-{}", r)},
          {"SHOAL_WORLD_SIZE", std::to_string(n)},
          {"SHOAL_K8S_SERVICE", "store-host-test"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"SHOAL_SECRET", "store host test secret"}};
    };
    run::LocalJob j(o);
    Deadline ready(60s);
    bool portBusy = false;
    for (int r = 0; r < n && !portBusy; ++r) {
      while (j.output(r).find("ready") == std::string::npos) {
        if (j.output(0).find("ERROR") != std::string::npos) {
          portBusy = true;
          break;
        }
        ASSERT_FALSE(ready.expired()) << "ranks never became ready\n" << allOutput(j, n);
        std::this_thread::sleep_for(5ms);  // polling log files
      }
    }
    if (portBusy) continue;
    j.signal(0, SIGSTOP);
    const auto t0 = Clock::now();
    Deadline hang(seconds(timeout + 20));
    for (int r = 1; r < n; ++r) {
      std::optional<run::RankExit> e;
      while (!(e = j.poll(r))) {
        ASSERT_FALSE(hang.expired()) << "rank " << r << " hung\n" << allOutput(j, n);
        std::this_thread::sleep_for(5ms);
      }
      EXPECT_EQ(e->exitCode, 3) << e->describe() << "\n" << j.output(r);
    }
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    // Every deadline started before the stop; the report may add at most its budget.
    EXPECT_LT(took, timeout + 1.0) << allOutput(j, n);
    bool skipped = false;
    for (int r = 1; r < n; ++r) {
      skipped |= j.output(r).find("diagnostics skipped") != std::string::npos;
    }
    EXPECT_TRUE(skipped) << "no survivor said it skipped the store queries:\n" << allOutput(j, n);
    return;
  }
  FAIL() << "no free port for the store in 5 attempts";
}

TEST(Mismatch, EveryRankGetsAMismatchErrorNamingBothSides) {
  constexpr int n = 4;
  TempDir dir;
  run::LocalJob j(job(n, {"mismatch"}, dir, {{"SHOAL_TIMEOUT", "10"}}));
  bool timedOut = false;
  auto exits = j.wait(30s, &timedOut);
  ASSERT_FALSE(timedOut) << allOutput(j, n);
  for (int r = 0; r < n; ++r) {
    std::string out = j.output(r);
    EXPECT_EQ(exits[r].exitCode, 4) << exits[r].describe() << "\n" << out;
    EXPECT_NE(out.find("ERROR MismatchError"), std::string::npos) << out;
    EXPECT_NE(out.find("100 x float32"), std::string::npos) << out;
    EXPECT_NE(out.find("77 x float32"), std::string::npos) << out;
  }
}

TEST(WrongSecret, TheImpostorIsRejectedAndNobodyHangs) {
  constexpr int n = 3;
  TempDir dir;
  run::LocalJob j(job(n, {"wrong-secret"}, dir, {{"SHOAL_TIMEOUT", "5"}}));
  bool timedOut = false;
  auto exits = j.wait(40s, &timedOut);
  ASSERT_FALSE(timedOut) << allOutput(j, n);
  for (auto& e : exits) EXPECT_FALSE(e.ok()) << e.describe();
  EXPECT_NE(j.output(1).find("secret"), std::string::npos) << j.output(1);
  // The store itself refuses the impostor (it authenticates every client), so it never gets
  // as far as a data connection; the others wait for it until their deadline.
  EXPECT_NE(j.output(1).find("wrong job secret"), std::string::npos) << j.output(1);
  EXPECT_NE(j.output(0).find("rank 1 did not join"), std::string::npos) << j.output(0);
}

}  // namespace
}  // namespace shoal::test
