// `shoal run` as a user runs it (the real binary, real processes), and the same rank program
// started the way Slurm and Kubernetes start it. Every job runs under a deadline: a hang fails.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/socket.h"
#include "run/local_job.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using Result = RunResult;

Result shoalRun(const std::vector<std::string>& args, const TempDir& dir,
                std::chrono::seconds timeout = 120s) {
  return test::shoalRun(SHOAL_BIN, args, dir, timeout);
}

// Processes whose command line contains `token` (the test's own marker).
int countProcesses(const std::string& token) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = readFile(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(token) != std::string::npos && cmd.find("shoal run") == std::string::npos &&
        std::stoi(name) != ::getpid()) {
      ++n;
    }
  }
  return n;
}

std::string uniqueToken() {
  return fmt::format("shoaltest{}x{}", ::getpid(),
                     std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
}

// --max-restarts without --elastic: a failed job is started again, whole, with the attempt in
// SHOAL_RESTART_COUNT; the logs go on; a job that keeps failing stops after the last restart
// with its own exit code.
TEST(LauncherRestart, AFailedJobStartsAgainWithTheAttemptCount) {
  TempDir dir;
  auto r = shoalRun(
      {"-n", "2", "--max-restarts", "2", "--output-dir", dir.path + "/logs", "--", "/bin/sh", "-c",
       "echo \"attempt $SHOAL_RESTART_COUNT/$TORCHELASTIC_RESTART_COUNT\"; "
       "if [ $SHOAL_RESTART_COUNT -lt 1 ] && [ $SHOAL_RANK = 1 ]; then exit 3; fi"},
      dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the job failed (exit code 3); starting every rank again (restart 1 "
                          "of 2, SHOAL_RESTART_COUNT=1)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 2 of 2"), std::string::npos) << r.output;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(r.output.find(fmt::format("[{}] attempt 1/1", k)), std::string::npos) << r.output;
    const std::string log = readFile(fmt::format("{}/logs/rank{}.log", dir.path, k));
    EXPECT_NE(log.find("attempt 0/0"), std::string::npos) << log;
    EXPECT_NE(log.find("attempt 1/1"), std::string::npos) << log;
  }

  auto always = shoalRun({"-n", "2", "--max-restarts", "1", "--", "/bin/sh", "-c", "exit 4"}, dir);
  EXPECT_EQ(always.code, 4) << always.output;
  EXPECT_NE(always.output.find("restart 1 of 1"), std::string::npos) << always.output;
  EXPECT_EQ(always.output.find("restart 2 of"), std::string::npos) << always.output;

  // Out of time is not a failure to retry.
  auto late = shoalRun(
      {"-n", "1", "--max-restarts", "3", "--time-limit", "0.5", "--", "/bin/sleep", "60"}, dir);
  EXPECT_EQ(late.code, 124) << late.output;
  EXPECT_EQ(late.output.find("starting every rank again"), std::string::npos) << late.output;
}

TEST(Launcher, EveryRankGetsItsEnvironmentAndPrefixedOutput) {
  TempDir dir;
  auto r = shoalRun({"-n", "3", "--output-dir", dir.path + "/logs", "--", "/bin/sh", "-c",
                     "echo \"r=$SHOAL_RANK w=$SHOAL_WORLD_SIZE lr=$SHOAL_LOCAL_RANK "
                     "lw=$SHOAL_LOCAL_WORLD_SIZE R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK "
                     "store=$SHOAL_STORE_ADDR master=$MASTER_ADDR:$MASTER_PORT "
                     "secret=${#SHOAL_SECRET}\"; echo to-stderr >&2"},
                    dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NE(r.output.find(fmt::format(
                  "[{}] r={} w=3 lr={} lw=3 R={} W=3 L={} store=127.0.0.1:", k, k, k, k, k)),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(fmt::format("[{}] to-stderr", k)), std::string::npos) << r.output;
    std::string log = readFile(fmt::format("{}/logs/rank{}.log", dir.path, k));
    EXPECT_NE(log.find(fmt::format("r={} w=3", k)), std::string::npos) << log;
    EXPECT_NE(log.find("to-stderr"), std::string::npos) << log;
  }
  // The store's address is announced; torchrun's names point at it; the secret is set (64 hex
  // digits) but never shown.
  auto at = r.output.find("store at 127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << r.output;
  std::string port = r.output.substr(at + 19, r.output.find('\n', at) - at - 19);
  EXPECT_NE(r.output.find("store=127.0.0.1:" + port + " master=127.0.0.1:" + port),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("secret=64"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SHOAL_SECRET="), std::string::npos);
}

TEST(Launcher, ServersAreStartedAfterTheWorkers) {
  TempDir dir;
  auto r = shoalRun({"-n", "3", "--servers", "2", "--", "/bin/sh", "-c",
                     "echo \"$SHOAL_RANK/$SHOAL_WORLD_SIZE $SHOAL_ROLE $SHOAL_ROLE_RANK "
                     "servers=$SHOAL_NUM_SERVERS\""},
                    dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (auto line : {"[0] 0/5 worker 0 servers=2", "[2] 2/5 worker 2 servers=2",
                    "[3] 3/5 server 0 servers=2", "[4] 4/5 server 1 servers=2"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  auto none = shoalRun({"--hosts", "localhost:2", "--servers", "2", "--", "/bin/true"}, dir);
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.output.find("--servers 2 leaves no slot for a worker"), std::string::npos)
      << none.output;
}

TEST(Launcher, ACollectiveJobRunsUnderIt) {
  TempDir dir;
  auto before = shmEntries();
  auto r = shoalRun({"-n", "3", "--timeout", "60", "--", SHOAL_TEST_WORKER, "matrix"}, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NE(r.output.find(fmt::format("[{}] rank {} of 3 (local {} of 3, started by shoal run): "
                                        "matrix done over shm, 0 failures",
                                        k, k, k)),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(shmEntries(), before) << "shared-memory files leaked";
}

TEST(Launcher, AFailedRankStopsTheJobWithASummary) {
  TempDir dir;
  const std::string token = uniqueToken();
  auto before = shmEntries();
  // Rank 1 fails; the others would sleep for a minute, and one of them ignores SIGTERM. Rank 1
  // fails only once rank 2 has said (through a FIFO: opening it blocks until both ends are
  // there) that it ignores SIGTERM, so the launcher's SIGKILL is certain to be needed.
  const std::string fifo = dir.path + "/armed";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = shoalRun({"-n", "4", "--grace", "1", "--", "/bin/sh", "-c",
                     "if [ $SHOAL_RANK = 1 ]; then timeout 30 cat " + fifo +
                         " >/dev/null || exit 99; echo last words; exit 7; fi; "
                         "if [ $SHOAL_RANK = 2 ]; then trap '' TERM; echo armed >" +
                         fifo + "; fi; sleep 60 && echo " + token},
                    dir, 60s);
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("rank 1 (host localhost, pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed first: exited with code 7. Its last lines:\n    last words"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("still running after 1 s: SIGKILL"), std::string::npos) << r.output;
  EXPECT_EQ(countProcesses(token), 0) << "orphans left behind";
  EXPECT_EQ(shmEntries(), before);
}

TEST(Launcher, AKilledRankIsReportedWithItsSignal) {
  TempDir dir;
  auto r = shoalRun(
      {"-n", "2", "--", "/bin/sh", "-c", "if [ $SHOAL_RANK = 0 ]; then kill -9 $$; fi; sleep 60"},
      dir, 60s);
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("rank 0 (host localhost"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by signal 9"), std::string::npos) << r.output;
}

TEST(Launcher, RanksThatDieInACollectiveFailTheJobFast) {
  TempDir dir;
  // A real collective job: rank 2 is killed while the others all-reduce; survivors throw, the
  // launcher stops everything. The worker ignores the token; it marks this test's processes.
  auto before = shmEntries();
  const std::string token = uniqueToken();
  std::vector<std::string> argv{
      SHOAL_BIN,        "run", "-n", "3", "--timeout", "20", "--", SHOAL_TEST_WORKER, "loop",
      "allreduce_ring", token};
  Proc p(argv, dir.path + "/out");
  // Wait for the ranks to be in the loop, then kill rank 2's process.
  pid_t victim = -1;
  ASSERT_TRUE(p.waitForOutput("[2] ready", 60s)) << p.output();
  {
    for (auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string env = readFile(e.path().string() + "/environ");
      std::string cmd = readFile(e.path().string() + "/cmdline");
      if (cmd.find(token) != std::string::npos && cmd.find("shoal run") == std::string::npos &&
          env.find(std::string("SHOAL_RANK=2\0", 13)) != std::string::npos) {
        victim = std::stoi(name);
      }
    }
  }
  ASSERT_GT(victim, 0) << p.output();
  ::kill(victim, SIGKILL);
  int code = p.wait(60s);
  std::string out = p.output();
  EXPECT_EQ(code, 128 + SIGKILL) << out;
  EXPECT_NE(out.find("job failed: rank 2 (host localhost"), std::string::npos) << out;
  EXPECT_EQ(countProcesses(token), 0) << out;
  EXPECT_EQ(shmEntries(), before);
}

// Rank 2 gives up by itself (exit 1, no collective failing); ranks 0, 1 and 3 fail in their next
// all-reduce because of it and exit 3, often within the launcher's settling window. Their abort
// records name rank 2 (run/failure_blame.h): the summary blames it, not rank 0 as the lowest.
TEST(Launcher, ARankThatFailsByItselfIsBlamedNotTheLowerRanksItTookDown) {
  TempDir dir;
  auto r =
      shoalRun({"-n", "4", "--timeout", "20", "--", SHOAL_TEST_WORKER, "exit-rank", "2"}, dir, 60s);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("job failed: rank 2 (host localhost"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed first: exited with code 1"), std::string::npos) << r.output;
}

TEST(Launcher, InterruptStopsEveryRank) {
  TempDir dir;
  const std::string token = uniqueToken();
  std::vector<std::string> argv{
      SHOAL_BIN, "run",     "-n", "3",
      "--",      "/bin/sh", "-c", "echo started; sleep 60 && echo " + token};
  Proc p(argv, dir.path + "/out");
  auto allStarted = [&] {
    auto out = p.output();
    return out.find("[0] started") != std::string::npos &&
           out.find("[1] started") != std::string::npos &&
           out.find("[2] started") != std::string::npos;
  };
  ASSERT_TRUE(p.waitForOutput([&](const std::string&) { return allStarted(); }, 60s)) << p.output();
  ASSERT_GE(countProcesses(token), 3) << p.output();
  ::kill(p.pid(), SIGINT);  // what Ctrl-C sends
  EXPECT_EQ(p.wait(30s), 128 + SIGINT) << p.output();
  EXPECT_NE(p.output().find("interrupted (Interrupt): stopping 3 ranks"), std::string::npos)
      << p.output();
  EXPECT_EQ(countProcesses(token), 0);
}

TEST(Launcher, TheTimeLimitEndsAJob) {
  TempDir dir;
  auto r = shoalRun({"-n", "2", "--time-limit", "1", "--", "/bin/sleep", "60"}, dir, 60s);
  EXPECT_EQ(r.code, 124) << r.output;
  EXPECT_NE(r.output.find("time limit of 1 s reached"), std::string::npos) << r.output;
}

// Configuration errors: one line, exit 2, and nothing started (the program would create a file).
class LauncherConfigError
    : public ::testing::TestWithParam<std::pair<std::vector<std::string>, std::string>> {};

TEST_P(LauncherConfigError, FailsBeforeAnythingStarts) {
  TempDir dir;
  const std::string marker = dir.path + "/started";
  auto [args, expected] = GetParam();
  for (auto& a : args) {
    if (a == "MARK") a = marker;
    if (a == "BUSY") {
      // A port someone listens on.
      static int port = 0;
      static Fd holder = listenTcp("127.0.0.1", 0, &port);
      a = std::to_string(port);
    }
  }
  auto r = shoalRun(args, dir, 30s);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "a rank was started";
}

INSTANTIATE_TEST_SUITE_P(
    , LauncherConfigError,
    ::testing::Values(
        std::make_pair(std::vector<std::string>{"-n", "0", "--", "/usr/bin/touch", "MARK"},
                       "shoal run: error: --ranks='0': expected an integer from 1 to 1048576"),
        std::make_pair(std::vector<std::string>{"--", "/usr/bin/touch", "MARK"},
                       "shoal run: error: -n is required"),
        std::make_pair(std::vector<std::string>{"--hosts", "no-such-host.invalid:2", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: unknown host 'no-such-host.invalid'"),
        std::make_pair(std::vector<std::string>{"--hostfile", "/nonexistent/hosts", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: hostfile '/nonexistent/hosts' cannot be read"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--", "no-such-program-xyz", "MARK"},
                       "shoal run: error: program 'no-such-program-xyz' not found"),
        std::make_pair(std::vector<std::string>{"--hosts", "localhost:1", "-n", "2", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: -n 2 ranks, but the hosts offer only 1 slots"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--port", "BUSY", "--", "/usr/bin/touch",
                                                "MARK"},
                       "the port is busy"),
        // Numbers: one parser, whole text, finite, in range.
        std::make_pair(std::vector<std::string>{"-n", "2", "--timeout", "inf", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: --timeout='inf': expected a finite number"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--timeout", "1e300", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: --timeout='1e300': expected a finite number"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--grace", "nan", "--", "/usr/bin/touch",
                                                "MARK"},
                       "shoal run: error: --grace='nan': expected a finite number"),
        std::make_pair(std::vector<std::string>{"-n", "2x", "--", "/usr/bin/touch", "MARK"},
                       "shoal run: error: --ranks='2x': expected an integer from 1 to"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--port", "70000", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: --port='70000': expected an integer from 0 to 65535"),
        std::make_pair(std::vector<std::string>{"-n", "2", "--join-file", "MARK.join", "--",
                                                "/usr/bin/touch", "MARK"},
                       "shoal run: error: --join-file needs --elastic MIN:MAX")));

// --join-file (run/join_file.h): written owner-only before the workers start, holding what they
// got (the secret and the store among it), and removed when the job ends.
TEST(JoinFile, IsWrittenOwnerOnlyWhileTheJobRunsAndRemovedAfter) {
  TempDir dir;
  const std::string file = dir.path + "/job.join";
  auto r = shoalRun(
      {"--elastic", "1:2", "-n", "1", "--timeout", "7", "--join-file", file, "--", "/bin/sh", "-c",
       fmt::format("stat -c 'mode=%a' {0}; "
                   "grep -qx \"SHOAL_SECRET=$SHOAL_SECRET\" {0} && echo secret-ok; "
                   "grep -qx \"SHOAL_STORE_ADDR=$SHOAL_STORE_ADDR\" {0} && echo "
                   "store-ok; grep -x -e SHOAL_ELASTIC=1:2 -e SHOAL_WORLD_SIZE=1 "
                   "-e SHOAL_TIMEOUT=7 {0}",
                   file)},
      dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line : {"[0] mode=600", "[0] secret-ok", "[0] store-ok", "[0] SHOAL_ELASTIC=1:2",
                           "[0] SHOAL_WORLD_SIZE=1", "[0] SHOAL_TIMEOUT=7"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(file)) << "the join file outlived the job";
}

// `shoal join FILE -- prog`: the program runs in the file's environment as a worker past the
// launch's slots, with a member id the store will hand out; a bad file or command is one line.
TEST(JoinFile, TheJoinerGetsTheJobsEnvironmentAndBadFilesAreOneLineErrors) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text, int mode) {
    const std::string path = dir.path + "/" + name;
    std::ofstream(path) << text;
    std::filesystem::permissions(path, static_cast<std::filesystem::perms>(mode));
    return path;
  };
  auto join = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{SHOAL_BIN, "join"};
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p(argv, dir.path + "/join.out");
    const int code = p.wait(30s);
    return std::make_pair(code, p.output());
  };
  const std::string header = "# shoal join file 1\n";
  const std::string good = write("good",
                                 header +
                                     "SHOAL_STORE_ADDR=127.0.0.1:1\nSHOAL_SECRET=abc\n"
                                     "SHOAL_ELASTIC=2:4\nSHOAL_WORLD_SIZE=3\nX_Y=a=b\n",
                                 0600);
  auto [code, out] = join({good, "--", "/bin/sh", "-c",
                           "echo $SHOAL_RANK $SHOAL_LOCAL_RANK/$SHOAL_LOCAL_WORLD_SIZE "
                           "$SHOAL_ROLE $SHOAL_ELASTIC_MEMBER $SHOAL_SECRET $SHOAL_ELASTIC $X_Y"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, "3 0/1 worker auto abc 2:4 a=b\n");

  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{dir.path + "/none", "--", "/bin/true"}, "No such file or directory (is the job running?"},
      {{write("open", header, 0644), "--", "/bin/true"}, "readable by others (mode 644)"},
      {{write("other", "NAME=value\n", 0600), "--", "/bin/true"}, "not a Shoal join file"},
      {{write("short", header + "SHOAL_SECRET=abc\n", 0600), "--", "/bin/true"},
       "no SHOAL_STORE_ADDR"},
      {{write("line", header + "SHOAL_SECRET abc\n", 0600), "--", "/bin/true"},
       "line 2 is not NAME=VALUE"},
      {{write("big", header + "A=" + std::string(70000, 'x') + "\n", 0600), "--", "/bin/true"},
       "more than a join file's 65536"},
      {{good}, "no program given (shoal join FILE -- prog args)"},
      {{good, "--", "/no/such/program"}, "/no/such/program: cannot be started"},
  };
  for (const auto& [args, expected] : bad) {
    auto [c, o] = join(args);
    EXPECT_EQ(c, 2) << o;
    EXPECT_NE(o.find("shoal join: error: "), std::string::npos) << o;
    EXPECT_NE(o.find(expected), std::string::npos) << expected << "\n" << o;
    EXPECT_EQ(std::count(o.begin(), o.end(), '\n'), 1) << o;
  }
}

TEST(Launcher, AnUnknownCommandIsNamed) {
  TempDir dir;
  Proc p({SHOAL_BIN, "rnu", "-n", "2"}, dir.path + "/out");
  EXPECT_EQ(p.wait(30s), 2) << p.output();
  EXPECT_EQ(p.output(),
            "shoal: error: unknown command 'rnu' (the commands: run, join, flight, ui, report, "
            "tensorboard, sweep; see shoal --help)\n");
}

// --- The same rank program started the way other launchers start it.

// Runs the collective matrix on n ranks started as another launcher would start them, with
// rank r's variables from env(r, attempt). Rank 0 hosts the store on a port that follows from
// the variables (Slurm: the job id; Kubernetes: MASTER_PORT), so the test never picks a port by
// binding and closing it: rank 0 is started alone and binds it itself; the others start only
// once it says (SHOAL_LOG_LEVEL=info) that it did. If that port is taken, rank 0 fails at once
// with "cannot host the job's store", nothing else has started, and the next attempt uses
// other variables.
void expectMatrixPasses(const std::function<Proc::Env(int rank, int attempt)>& env, int n,
                        const std::string& launcher) {
  TempDir dir;
  std::vector<std::unique_ptr<Proc>> ranks;
  const std::string hosting = "hosts the job's store on port";
  for (int attempt = 0; attempt < 5 && ranks.empty(); ++attempt) {
    Proc::Env e0 = env(0, attempt);
    e0.emplace_back("SHOAL_LOG_LEVEL", "info");
    auto rank0 = std::make_unique<Proc>(std::vector<std::string>{SHOAL_TEST_WORKER, "matrix"},
                                        fmt::format("{}/rank0.{}", dir.path, attempt), e0);
    if (rank0->waitForOutput(hosting, 60s)) {
      ranks.push_back(std::move(rank0));
      break;
    }
    const int code = rank0->wait(60s);
    ASSERT_NE(rank0->output().find("cannot host the job's store"), std::string::npos)
        << "rank 0 exited " << code << " without hosting the store:\n"
        << rank0->output();
  }
  ASSERT_EQ(ranks.size(), 1u) << "five ports in a row were taken";
  for (int r = 1; r < n; ++r) {
    // The attempt that worked: rank 0's variables.
    ranks.push_back(std::make_unique<Proc>(std::vector<std::string>{SHOAL_TEST_WORKER, "matrix"},
                                           fmt::format("{}/rank{}", dir.path, r), env(r, -1)));
  }
  for (int r = 0; r < n; ++r) {
    const int code = ranks[r]->wait(300s);
    const std::string out = ranks[r]->output();
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find(fmt::format("started by {}): matrix done", launcher)), std::string::npos)
        << out;
    EXPECT_NE(out.find(", 0 failures"), std::string::npos) << out;
  }
}

int randomIn(int lo, int hi) {
  std::random_device rd;
  return std::uniform_int_distribution<int>(lo, hi)(rd);
}

TEST(OtherLaunchers, SlurmSrun) {
  const int n = 3;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string node = host;
  int jobId = 0;
  auto env = [&](int r, int attempt) {
    if (attempt >= 0) jobId = 1000000 + randomIn(0, 19999);  // store port 20000 + id % 20000
    return Proc::Env{
        {"SLURM_PROCID", std::to_string(r)},
        {"SLURM_LOCALID", std::to_string(r)},
        {"SLURM_NTASKS", std::to_string(n)},
        {"SLURM_STEP_NUM_TASKS", std::to_string(n)},
        {"SLURM_TASKS_PER_NODE", fmt::format("{}", n)},
        {"SLURM_STEP_TASKS_PER_NODE", fmt::format("{}", n)},
        {"SLURM_NODEID", "0"},
        {"SLURM_JOB_NUM_NODES", "1"},
        {"SLURM_JOB_NODELIST", node},
        {"SLURM_STEP_NODELIST", node},
        {"SLURM_JOB_ID", std::to_string(jobId)},
    };
  };
  expectMatrixPasses(env, n, "slurm");
}

// Slurm across nodes and Kubernetes start ranks that share no secret: refused before any store
// is open (the one-node Slurm job above shares a generated one, run/node_secret.h).
TEST(OtherLaunchers, JobsAcrossHostsWithoutASecretAreRefusedBeforeAnyStoreIsOpen) {
  const std::vector<std::pair<Proc::Env, std::string>> cases{
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_NODEID", "0"},
        {"SLURM_JOB_NUM_NODES", "2"},
        {"SLURM_JOB_NODELIST", "localhost,localhost"},
        {"SLURM_JOB_ID", "17"}},
       "slurm: a job across 2 nodes needs a shared secret: set SHOAL_SECRET or "
       "SHOAL_SECRET_FILE"},
      {{{"JOB_COMPLETION_INDEX", "0"},
        {"SHOAL_WORLD_SIZE", "2"},
        {"SHOAL_K8S_SERVICE", "shoal-demo"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "1"}},
       "kubernetes: a job across 2 pods needs a shared secret"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_JOB_NUM_NODES", "1"},
        {"SLURM_JOB_NODELIST", "localhost"}},
       "slurm: SLURM_JOB_ID is not set, so the tasks cannot share a generated secret"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_JOB_NUM_NODES", "1"},
        {"SLURM_JOB_NODELIST", "localhost"},
        {"SLURM_JOB_ID", "12x"}},
       "slurm: SLURM_JOB_ID '12x' is not a job id"},
  };
  for (const auto& [env, expected] : cases) {
    TempDir dir;
    Proc p({SHOAL_TEST_WORKER, "matrix"}, dir.path + "/out", env);
    EXPECT_EQ(p.wait(60s), 2) << expected << "\n" << p.output();
    const std::string out = p.output();
    EXPECT_NE(out.find("ERROR InvalidArgument: " + expected), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

// mpirun given a store address: a program without MPI (plain shoal::init(), as the flight
// worker) has nothing to send a generated secret over, so it is refused before any store is
// open (with MPI, rank 0 sends one: the mpirun_store_address_generated_secret test).
TEST(OtherLaunchers, MpirunWithAStoreAddressAndNoSecretNeedsMpiToSendOne) {
  for (const auto& addr : {std::pair<std::string, std::string>{"SHOAL_STORE_ADDR", "127.0.0.1:1"},
                           {"MASTER_ADDR", "127.0.0.1"}}) {
    TempDir dir;
    Proc p({SHOAL_FLIGHT_WORKER}, dir.path + "/out",
           {{"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "2"},
            {addr.first, addr.second},
            {"MASTER_PORT", "1"}});
    EXPECT_EQ(p.wait(60s), 1) << p.output();
    const std::string out = p.output();
    EXPECT_NE(out.find("ERROR InvalidArgument: mpirun: a store address (SHOAL_STORE_ADDR or "
                       "MASTER_ADDR) without SHOAL_SECRET would open the store"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("set SHOAL_SECRET or SHOAL_SECRET_FILE, or link Shoal::mpi"),
              std::string::npos)
        << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

TEST(OtherLaunchers, KubernetesIndexedJob) {
  const int n = 3;
  int port = 0;
  auto env = [&](int r, int attempt) {
    if (attempt >= 0) port = randomIn(20000, 39999);
    // As examples/k8s/shoal-job.yaml sets them, with the store's DNS name replaced by this
    // machine (no cluster DNS here).
    return Proc::Env{
        {"JOB_COMPLETION_INDEX", std::to_string(r)},
        {"HOSTNAME", fmt::format("shoal-demo-{}", r)},
        {"SHOAL_WORLD_SIZE", std::to_string(n)},
        {"SHOAL_K8S_SERVICE", "shoal-demo"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {"SHOAL_SECRET", "a secret from a Kubernetes Secret"},
    };
  };
  expectMatrixPasses(env, n, "kubernetes");
}

}  // namespace
}  // namespace shoal::test
