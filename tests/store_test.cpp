// One conformance suite every store implementation passes, plus the TCP store's failure modes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/encryption.h"
#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/socket.h"
#include "store/file_store.h"
#include "store/memory_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {
namespace {

using namespace std::chrono_literals;

const std::string kSecret = "store-test-secret";

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
    TcpStoreServerOptions o;
    o.secret = kSecret;
    f->server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, o);
    f->store = std::make_shared<TcpStore>(HostPort{"127.0.0.1", f->server->port()}, 5s, kSecret);
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
  // The waiter may park before or after k1 appears; either way it must return only once k2
  // exists too, which only the main thread's last set provides.
  std::promise<void> started;
  std::thread waiter([&] {
    started.set_value();
    s.wait({"k1", "k2"}, 10s);
    EXPECT_TRUE(s.check({"k1", "k2"}));
  });
  started.get_future().wait();
  s.set("k1", "1");
  EXPECT_FALSE(s.check({"k2"}));
  s.set("k2", "2");
  waiter.join();
  EXPECT_EQ(s.get("k2", 1s), "2");
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
      if (f->server) {
        s = std::make_shared<TcpStore>(HostPort{"127.0.0.1", f->server->port()}, 5s, kSecret);
      }
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
  // A placeholder holds the port (no race with other processes) and never answers: the client's
  // first connection lands in its backlog and waits for a greeting that never comes.
  int port = 0;
  Fd placeholder = listenTcp("127.0.0.1", 0, &port);
  std::string error;
  std::thread client([&] {
    try {
      TcpStore s(HostPort{"127.0.0.1", port}, 10s);
      s.set("k", "v");
      EXPECT_EQ(s.get("k", 1s), "v");
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  // Once the client is knocking, hand the port over to the real server.
  pollfd p{placeholder.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the client never connected";
  placeholder.reset();  // resets the connection in its backlog: the client retries
  TcpStoreServer server("127.0.0.1", port);
  client.join();
  EXPECT_EQ(error, "");
}

// Reads the server's greeting off a raw connection.
auth::Greeting readGreeting(int fd) {
  auth::Greeting g{};
  readAll(fd, &g, sizeof(g), Deadline(5s), "test");
  return g;
}

// True when the server closes `fd` (EOF or reset) within `limit`; false if it stays open.
bool closedWithin(int fd, Duration limit) {
  Deadline deadline(limit);
  char c;
  for (;;) {
    try {
      readAll(fd, &c, 1, deadline, "test");
    } catch (const PeerError&) {
      return true;
    } catch (const TimeoutError&) {
      return false;
    }
  }
}

TEST(TcpStore, MalformedClientIsDroppedAndOthersAreServed) {
  TcpStoreServer server("127.0.0.1", 0);
  Fd bad = connectTcp(HostPort{"127.0.0.1", server.port()}, Deadline(2s), "test");
  EXPECT_EQ(readGreeting(bad.get()).status, static_cast<uint32_t>(auth::GreetingStatus::kOpen));
  // A frame whose only field claims more bytes than the frame holds.
  const uint32_t frame[] = {9, 0, 0};
  std::string bytes(reinterpret_cast<const char*>(frame), 4);
  bytes += std::string("\x01\x01\x00\x00\x00\x64\x00\x00\x00", 9);
  writeAll(bad.get(), bytes.data(), bytes.size(), Deadline(1s), "test");
  EXPECT_TRUE(closedWithin(bad.get(), 5s)) << "the server kept a malformed client";
  TcpStore good(HostPort{"127.0.0.1", server.port()}, 2s);
  good.set("still", "serving");
  EXPECT_EQ(good.get("still", 1s), "serving");
}

size_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(TcpStoreLimits, OversizeValueIsRefusedWithoutBufferingIt) {
  TcpStoreServerOptions o;
  o.secret = "s3cret";
  o.maxValueBytes = 1 << 20;
  TcpStoreServer server("127.0.0.1", 0, o);
  TcpStore client(HostPort{"127.0.0.1", server.port()}, 10s, "s3cret");
  client.set("small", "ok");
  const size_t storedBefore = server.storedBytes();
  const size_t rssBefore = residentBytes();
  // 32 MiB streamed from a 64 KiB buffer by a raw (authenticated) connection, so the only
  // place the value could pile up is the server.
  Fd raw = connectTcp(HostPort{"127.0.0.1", server.port()}, Deadline(2s), "test");
  auth::connect(raw.get(), "s3cret", auth::Channel::kStore, 0, -1, -1, Deadline(5s), "test");
  // Loopback: both ends merely allow encryption, so the connection stays in clear.
  ASSERT_FALSE(encryption::negotiate(raw.get(), EncryptMode::kAuto, false, Deadline(5s), "test"));
  const uint32_t valueBytes = 32u << 20;
  std::string head = wire::encode(wire::kSet, {"big", ""});
  uint32_t len = 0;
  std::memcpy(&len, head.data(), 4);
  len += valueBytes;
  std::memcpy(head.data(), &len, 4);
  // The value's length field is the last 4 bytes of the encoded (empty) value.
  std::memcpy(head.data() + head.size() - 4, &valueBytes, 4);
  writeAll(raw.get(), head.data(), head.size(), Deadline(5s), "test");
  std::string chunk(64 << 10, 'v');
  for (uint32_t sent = 0; sent < valueBytes; sent += chunk.size()) {
    writeAll(raw.get(), chunk.data(), chunk.size(), Deadline(10s), "test");
  }
  uint32_t replyLen = 0;
  readAll(raw.get(), &replyLen, 4, Deadline(10s), "test");
  ASSERT_LT(replyLen, 4096u);
  std::string reply(4 + replyLen, '\0');
  std::memcpy(reply.data(), &replyLen, 4);
  readAll(raw.get(), reply.data() + 4, replyLen, Deadline(5s), "test");
  auto m = wire::tryDecode(reply);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->code, wire::kFailed);
  ASSERT_EQ(m->fields.size(), 1u);
  EXPECT_NE(m->fields[0].find("exceeds the store's limit"), std::string::npos) << m->fields[0];
  EXPECT_EQ(server.storedBytes(), storedBefore);
  EXPECT_LT(residentBytes(), rssBefore + (16u << 20)) << "the server buffered the value";
  // The same connection is still in step, and so is everyone else.
  const std::string ok = wire::encode(wire::kGet, {"small"});
  writeAll(raw.get(), ok.data(), ok.size(), Deadline(5s), "test");
  readAll(raw.get(), &replyLen, 4, Deadline(5s), "test");
  EXPECT_EQ(client.get("small", 1s), "ok");

  // Through the client: a one-line StoreError naming the store and the limit.
  try {
    client.set("big", std::string(2u << 20, 'v'));
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("127.0.0.1:{}", server.port())), std::string::npos) << what;
    EXPECT_NE(what.find("value of 2097152 bytes"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_FALSE(client.check({"big"}));
  // Keys are bounded too.
  EXPECT_THROW(client.set(std::string(o.maxKeyBytes + 1, 'k'), "v"), StoreError);
}

TEST(TcpStoreLimits, WrongOrMissingSecretIsRefusedAndTheStoreKeepsServing) {
  TcpStoreServerOptions o;
  o.secret = "s3cret";
  o.handshakeTimeout = 500ms;
  TcpStoreServer server("127.0.0.1", 0, o);
  const HostPort at{"127.0.0.1", server.port()};
  TcpStore good(at, 5s, "s3cret");
  good.set("k", "v");
  auto expectRefused = [&](const std::string& secret, const std::string& needle) {
    TcpStore s(at, 5s, secret);
    auto t0 = Clock::now();
    try {
      s.get("k", 5s);
      ADD_FAILURE() << "expected StoreError for secret '" << secret << "'";
    } catch (const StoreError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(at.str()), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_LT(Clock::now() - t0, 3s) << "a refused client must not wait for its deadline";
  };
  expectRefused("guess", "authentication failed: wrong job secret?");
  expectRefused("", "requires the job secret");
  // A client that skips the handshake and sends a request is never answered, then closed.
  Fd raw = connectTcp(at, Deadline(2s), "test");
  readGreeting(raw.get());
  const std::string req = wire::encode(wire::kGet, {"k"});
  writeAll(raw.get(), req.data(), req.size(), Deadline(1s), "test");
  EXPECT_TRUE(closedWithin(raw.get(), 10s));
  EXPECT_EQ(good.get("k", 1s), "v");
  // And a client holding a secret refuses a store that has none (it could be anyone's).
  TcpStoreServer open("127.0.0.1", 0);
  TcpStore careful(HostPort{"127.0.0.1", open.port()}, 5s, "s3cret");
  EXPECT_THROW(careful.set("k", "v"), StoreError);
}

TEST(TcpStoreLimits, ConnectionsBeyondTheLimitAreRefused) {
  TcpStoreServerOptions o;
  o.maxConnections = 2;
  TcpStoreServer server("127.0.0.1", 0, o);
  const HostPort at{"127.0.0.1", server.port()};
  auto a = std::make_unique<TcpStore>(at, 5s);
  TcpStore b(at, 5s);
  a->set("a", "1");  // each keeps its connection open in its pool
  b.set("b", "2");
  // Refused at once, and again on each retry until the deadline (busy: try again later); the
  // error names the refusal, also when the deadline ends inside a retry's handshake (this
  // test once failed that way on a loaded machine). The deadline is generous: a loaded machine
  // under sanitizers has taken more than 0.5 s to answer.
  TcpStore c(at, 5s);
  try {
    c.set("c", "3");
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("connection limit"), std::string::npos) << e.what();
  }
  a.reset();  // frees a slot: the next client gets in (retrying until the server notices)
  TcpStore d(at, 10s);
  d.set("d", "4");
  EXPECT_EQ(b.get("d", 1s), "4");
}

TEST(TcpStoreLimits, SilentAndIdleConnectionsAreClosed) {
  TcpStoreServerOptions o;
  o.secret = "s3cret";
  o.handshakeTimeout = 300ms;
  o.idleTimeout = 300ms;
  TcpStoreServer server("127.0.0.1", 0, o);
  const HostPort at{"127.0.0.1", server.port()};
  // Never says a word.
  Fd silent = connectTcp(at, Deadline(2s), "test");
  // Authenticates, then stays quiet.
  Fd idle = connectTcp(at, Deadline(2s), "test");
  auth::connect(idle.get(), "s3cret", auth::Channel::kStore, 0, -1, -1, Deadline(5s), "test");
  // Generous upper bounds: the limits are 0.3 s.
  EXPECT_TRUE(closedWithin(silent.get(), 10s)) << "a silent connection was kept";
  EXPECT_TRUE(closedWithin(idle.get(), 10s)) << "an idle connection was kept";
  // A parked get is not idle: it outlives the idle limit and is answered.
  TcpStore waiter(at, 5s, "s3cret");
  std::string got;
  std::thread getter([&] { got = waiter.get("later", 10s); });
  // The get is parked once the server counts it; then let more than the idle limit pass on a
  // condition the server itself controls (a silent connection being closed).
  Fd probe = connectTcp(at, Deadline(2s), "test");
  EXPECT_TRUE(closedWithin(probe.get(), 10s));
  TcpStore(at, 5s, "s3cret").set("later", "here");
  getter.join();
  EXPECT_EQ(got, "here");
}

TEST(TcpStoreLimits, ListensOnlyOnTheGivenAddress) {
  TcpStoreServer server("127.0.0.1", 0);
  // 127.0.0.2 is this host too, but not the address the server was given.
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(server.port()));
  ASSERT_EQ(::inet_pton(AF_INET, "127.0.0.2", &sa.sin_addr), 1);
  EXPECT_NE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  TcpStore s(HostPort{"127.0.0.1", server.port()}, 2s);
  s.set("k", "v");
}

TEST(TcpStoreLimits, ParkedRequestsAreBounded) {
  TcpStoreServerOptions o;
  o.maxParked = 1;
  TcpStoreServer server("127.0.0.1", 0, o);
  const HostPort at{"127.0.0.1", server.port()};
  TcpStore first(at, 5s), second(at, 5s);
  std::string got;
  std::thread parked([&] {
    // Refused while the prober's wait holds the only slot: ask again.
    Deadline deadline(20s);
    while (got.empty() && !deadline.expired()) {
      try {
        got = first.get("key", 10s);
      } catch (const StoreError&) {
      }
    }
  });
  // Until the first get is parked, the second is parked instead (and the first refused): retry
  // the probe until exactly one side is refused, within a deadline.
  Deadline deadline(10s);
  bool refused = false;
  while (!refused && !deadline.expired()) {
    try {
      second.wait({"key"}, 50ms);
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("too many waiting"), std::string::npos) << e.what();
      refused = true;
    } catch (const TimeoutError&) {
      // Our wait parked first (or the first one was not sent yet): try again.
    }
  }
  EXPECT_TRUE(refused);
  second.set("key", "v");
  parked.join();
  EXPECT_EQ(got, "v");
}

}  // namespace
}  // namespace shoal::store
