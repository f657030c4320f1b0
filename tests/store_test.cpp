// One conformance suite every store implementation passes, plus the TCP store's failure modes.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/error.h"
#include "common/socket.h"
#include "store/file_store.h"
#include "store/memory_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"

namespace shoal::store {
namespace {

using namespace std::chrono_literals;

struct Fixture {
  std::shared_ptr<Store> store;
  std::unique_ptr<TcpStoreServer> server;
  std::string dir;
  ~Fixture() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

std::unique_ptr<Fixture> make(const std::string& kind) {
  auto f = std::make_unique<Fixture>();
  if (kind == "memory") {
    f->store = std::make_shared<MemoryStore>();
  } else if (kind == "file") {
    char tmpl[] = "/tmp/shoal-store-XXXXXX";
    f->dir = ::mkdtemp(tmpl);
    f->store = std::make_shared<FileStore>(f->dir + "/kv");
  } else {
    f->server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    f->store = std::make_shared<TcpStore>(HostPort{"127.0.0.1", f->server->port()}, 5s);
  }
  return f;
}

class StoreConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreConformance, SetGetAddCompareSetDeleteCheck) {
  auto f = make(GetParam());
  Store& s = *f->store;
  s.set("a", std::string("x\0y", 3));
  EXPECT_EQ(s.get("a", 1s), std::string("x\0y", 3));
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.get("n", 1s), "3");
  EXPECT_EQ(s.compareSet("c", "", "first"), "first");        // absent matches ""
  EXPECT_EQ(s.compareSet("c", "wrong", "second"), "first");  // no change
  EXPECT_EQ(s.compareSet("c", "first", "second"), "second");
  EXPECT_TRUE(s.check({"a", "n", "c"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  EXPECT_TRUE(s.deleteKey("a"));
  EXPECT_FALSE(s.deleteKey("a"));
  EXPECT_FALSE(s.check({"a"}));
}

TEST_P(StoreConformance, WaitBlocksUntilAllKeysExist) {
  auto f = make(GetParam());
  Store& s = *f->store;
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    s.set("k1", "1");
    std::this_thread::sleep_for(50ms);
    s.set("k2", "2");
  });
  auto t0 = Clock::now();
  s.wait({"k1", "k2"}, 5s);
  EXPECT_GE(Clock::now() - t0, 90ms);
  EXPECT_EQ(s.get("k2", 1s), "2");
  setter.join();
}

TEST_P(StoreConformance, MissingKeyTimesOutNamingIt) {
  auto f = make(GetParam());
  auto t0 = Clock::now();
  try {
    f->store->get("never-set", 200ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST_P(StoreConformance, AddOnANonCounterIsAnError) {
  auto f = make(GetParam());
  f->store->set("text", "hello");
  EXPECT_THROW(f->store->add("text", 1), StoreError);
}

TEST_P(StoreConformance, PrefixScopesKeys) {
  auto f = make(GetParam());
  PrefixStore a("job-a", f->store), b("job-b", f->store);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(a.get("k", 1s), "from a");
  EXPECT_EQ(b.get("k", 1s), "from b");
  EXPECT_EQ(f->store->get("job-a/k", 1s), "from a");
}

TEST_P(StoreConformance, ConcurrentAddsLoseNothing) {
  auto f = make(GetParam());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      // Each thread its own client where the store has connections.
      std::shared_ptr<Store> s = f->store;
      if (f->server) s = std::make_shared<TcpStore>(HostPort{"127.0.0.1", f->server->port()}, 5s);
      for (int i = 0; i < 50; ++i) s->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(f->store->get("counter", 1s), "200");
}

INSTANTIATE_TEST_SUITE_P(All, StoreConformance, ::testing::Values("memory", "file", "tcp"));

TEST(TcpStore, UnreachableStoreIsAStoreErrorNamingTheAddress) {
  int port = 0;
  { Fd probe = listenTcp("127.0.0.1", 0, &port); }  // a port nobody listens on now
  TcpStore s(HostPort{"127.0.0.1", port}, 300ms);
  auto t0 = Clock::now();
  try {
    s.set("k", "v");
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", port)), std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 3s);
}

TEST(TcpStore, ClientRetriesUntilTheServerComesUp) {
  int port = 0;
  { Fd probe = listenTcp("127.0.0.1", 0, &port); }
  std::unique_ptr<TcpStoreServer> server;
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  TcpStore s(HostPort{"127.0.0.1", port}, 5s);
  s.set("k", "v");
  EXPECT_EQ(s.get("k", 1s), "v");
  later.join();
}

TEST(TcpStore, MalformedClientIsDroppedAndOthersAreServed) {
  TcpStoreServer server("127.0.0.1", 0);
  Fd bad = connectTcp(HostPort{"127.0.0.1", server.port()}, Deadline(2s), "test");
  uint32_t huge = 0xffffffffu;  // a frame length far over the limit: must not be allocated
  writeAll(bad.get(), &huge, 4, Deadline(1s), "test");
  char junk[16] = {};
  writeAll(bad.get(), junk, sizeof(junk), Deadline(1s), "test");
  char c;
  EXPECT_THROW(readAll(bad.get(), &c, 1, Deadline(2s), "test"), PeerError);  // server hung up
  TcpStore good(HostPort{"127.0.0.1", server.port()}, 2s);
  good.set("still", "serving");
  EXPECT_EQ(good.get("still", 1s), "serving");
}

}  // namespace
}  // namespace shoal::store
