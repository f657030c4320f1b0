// run/host_discovery.h with real programs: what a good run lists, and the runs that must change
// nothing (a failure, an overrun, too much or malformed output, no hosts), each one line naming
// the program. And run/slot_pool.h, the launcher's bookkeeping of the slots it offers.
#include "run/host_discovery.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "common/error.h"
#include "run/slot_pool.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using run::HostDiscovery;
using run::HostDiscoveryOptions;

class HostDiscoveryTest : public ::testing::Test {
 protected:
  // An executable shell script with `body`.
  std::string script(const std::string& body) {
    const std::string path = fmt::format("{}/discover{}.sh", dir_.path, n_++);
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
    return path;
  }

  HostDiscoveryOptions options(const std::string& program) {
    HostDiscoveryOptions o;
    o.program = program;
    o.interval = std::chrono::milliseconds(10);
    o.timeout = std::chrono::seconds(20);
    return o;
  }

  // The error of runNow(), or "" if it returned hosts.
  std::string runError(const HostDiscoveryOptions& o) {
    try {
      HostDiscovery(o).runNow();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }

  TempDir dir_;
  int n_ = 0;
};

TEST_F(HostDiscoveryTest, ListsHostsAndAddsUpAHostListedTwice) {
  HostDiscovery d(options(script(
      "echo '# the pool'; echo 'localhost:2'; echo; echo '127.0.0.1 slots=3'; echo localhost")));
  auto hosts = d.runNow();
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "localhost");
  EXPECT_EQ(hosts[0].slots, 3);
  EXPECT_EQ(hosts[1].host, "127.0.0.1");
  EXPECT_EQ(hosts[1].slots, 3);
}

TEST_F(HostDiscoveryTest, RunsThatChangeNothingAreOneLineErrors) {
  struct Case {
    std::string body, message;
  } cases[] = {
      {"echo localhost:2; exit 3", "exited with code 3"},
      {"echo 'localhost:zero'", "slots 'zero' must be 1..4096"},
      {"echo '# nothing here'", "listed no hosts"},
      {"echo no-such-host.invalid:2", "unknown host 'no-such-host.invalid'"},
      {"head -c 100000 /dev/zero | tr '\\0' 'a'", "printed more than 65536 bytes"},
  };
  for (const auto& c : cases) {
    const std::string program = script(c.body);
    const std::string error = runError(options(program));
    EXPECT_NE(error.find(c.message), std::string::npos) << c.body << ": " << error;
    EXPECT_NE(error.find(program), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST_F(HostDiscoveryTest, AnOverrunningProgramIsKilledWithWhatItStarted) {
  const std::string pidFile = dir_.path + "/child.pid";
  auto o = options(script(fmt::format("sleep 600 & echo $! > {}; wait", pidFile)));
  o.timeout = std::chrono::milliseconds(300);
  const auto started = Clock::now();
  const std::string error = runError(o);
  EXPECT_NE(error.find("did not finish within"), std::string::npos) << error;
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(20));  // a generous bound
  pid_t child = 0;
  std::ifstream(pidFile) >> child;
  ASSERT_GT(child, 0);
  // Its process group was killed: the background child is gone, or exits (SIGKILL is delivered
  // asynchronously: it may still be running for a moment). Wait for its exit as an event, with a
  // generous bound.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  if (fd < 0) {
    EXPECT_EQ(errno, ESRCH) << "pidfd_open";  // already gone (and reaped)
  } else {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 20000), 1) << "the program's child survived";
    ::close(fd);
  }
}

TEST_F(HostDiscoveryTest, PollRunsAgainAfterTheIntervalAndReportsEachRun) {
  const std::string counter = dir_.path + "/runs";
  HostDiscovery d(
      options(script(fmt::format("n=$(cat {0} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {0}; "
                                 "if [ $n -eq 2 ]; then exit 1; fi; echo localhost:$n",
                                 counter))));
  std::vector<run::DiscoveryResult> results;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (results.size() < 3 && Clock::now() < deadline) {
    if (auto r = d.poll()) {
      results.push_back(*r);
      continue;
    }
    pollfd p{d.fd(), POLLIN, 0};
    ::poll(&p, d.fd() >= 0 ? 1 : 0, 20);  // woken by output, else the next turn
  }
  ASSERT_EQ(results.size(), 3u);
  ASSERT_FALSE(results[0].error);
  EXPECT_EQ(results[0].hosts.at(0).slots, 1);
  ASSERT_TRUE(results[1].error);
  EXPECT_NE(results[1].error->find("exited with code 1"), std::string::npos);
  EXPECT_TRUE(results[1].hosts.empty());
  ASSERT_FALSE(results[2].error) << *results[2].error;
  EXPECT_EQ(results[2].hosts.at(0).slots, 3);
}

TEST_F(HostDiscoveryTest, AMissingProgramIsReportedByPoll) {
  HostDiscovery d(options(dir_.path + "/does-not-exist"));
  auto r = d.poll();
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->error);
  EXPECT_NE(r->error->find("does-not-exist"), std::string::npos) << *r->error;
}

TEST(SlotPool, FreeSlotsFollowTheOfferAndSkipFailedOnes) {
  run::SlotPool pool;
  pool.offer({{"localhost", 2}, {"127.0.0.1", 1}});
  auto a = pool.freeSlot(false);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "localhost");
  EXPECT_EQ(a->localRank, 0);
  EXPECT_EQ(a->localSize, 2);
  pool.occupy(*a);
  auto b = pool.freeSlot(false);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->localRank, 1);
  pool.occupy(*b);
  // The worker on localhost:1 fails: growth skips its slot, a restart may take it.
  pool.release(*b, true);
  auto c = pool.freeSlot(false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->host, "127.0.0.1");
  pool.occupy(*c);
  EXPECT_FALSE(pool.freeSlot(false));
  auto d = pool.freeSlot(true);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->host, "localhost");
  EXPECT_EQ(d->localRank, 1);
  // The offer shrinks: localhost keeps one slot, 127.0.0.1 leaves.
  pool.offer({{"localhost", 1}});
  EXPECT_TRUE(pool.offers(*a));
  EXPECT_FALSE(pool.offers(*b));
  EXPECT_FALSE(pool.offers(*c));
  EXPECT_EQ(run::SlotPool::describe(pool.offered()), "localhost:1");
  // A worker that ended without failing frees its slot for growth.
  pool.release(*a, false);
  auto e = pool.freeSlot(false);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->localRank, 0);
}

}  // namespace
}  // namespace shoal::test
