// Encryption (common/encryption.h, common/tls.h): the setting and its agreement rule, the TLS
// session on its own (same key, another key, a peer that does not speak TLS), collectives and
// point-to-point over encrypted TCP links (thread ranks and real processes), the store over TLS,
// and every mismatch failing fast with one line naming the peer. What travels on the wire is
// checked by tests/multihost/capture_test.sh (network namespaces, a packet capture).
#include "common/encryption.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <future>
#include <numeric>
#include <thread>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/env.h"
#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/tls.h"
#include "run/local_job.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "tests/matrix.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"
#include "transport/tcp/link_security.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;
using encryption::Stance;

// ---- the setting

EnvReader oneVariable(const std::string& name, const std::string& value) {
  return [=](const std::string& n) -> std::optional<std::string> {
    if (n == name) return value;
    return std::nullopt;
  };
}

TEST(EncryptSetting, AcceptsItsValuesAndRefusesOthersInOneLine) {
  EXPECT_EQ(readEnvConfig([](const std::string&) { return std::nullopt; }).encrypt,
            EncryptMode::kAuto);
  const std::pair<const char*, EncryptMode> good[] = {{"0", EncryptMode::kOff},
                                                      {"off", EncryptMode::kOff},
                                                      {"1", EncryptMode::kOn},
                                                      {"on", EncryptMode::kOn},
                                                      {"auto", EncryptMode::kAuto}};
  for (const auto& [text, mode] : good) {
    EXPECT_EQ(readEnvConfig(oneVariable("SHOAL_ENCRYPT", text)).encrypt, mode) << text;
  }
  for (const char* bad : {"yes", "2", "ON", " on", "on ", "true"}) {
    try {
      readEnvConfig(oneVariable("SHOAL_ENCRYPT", bad));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("SHOAL_ENCRYPT='{}': expected 0, off, 1, on or auto", bad));
    }
  }
  EXPECT_THROW(readEnvConfig(oneVariable("SHOAL_ENCRYPT", "")), InvalidArgument);
  EXPECT_NE(describe(readEnvConfig(oneVariable("SHOAL_ENCRYPT", "1"))).find("encrypt=on"),
            std::string::npos);
}

TEST(EncryptSetting, AutoRequiresAcrossHostsAndOnlyAllowsOnOne) {
  auto stance = [](EncryptMode m, bool across) {
    return static_cast<Stance>(encryption::makeOffer(m, across).stance);
  };
  EXPECT_EQ(stance(EncryptMode::kAuto, true), Stance::kRequire);
  EXPECT_EQ(stance(EncryptMode::kAuto, false), Stance::kAllow);
  EXPECT_EQ(stance(EncryptMode::kOn, false), Stance::kRequire);
  EXPECT_EQ(stance(EncryptMode::kOff, true), Stance::kRefuse);

  // Every pair of settings, on one host and across hosts: the two ends reach the same answer.
  const EncryptMode modes[] = {EncryptMode::kOff, EncryptMode::kOn, EncryptMode::kAuto};
  for (bool across : {false, true}) {
    for (EncryptMode a : modes) {
      for (EncryptMode b : modes) {
        std::string whyA, whyB;
        const auto oa = encryption::makeOffer(a, across), ob = encryption::makeOffer(b, across);
        const auto da = encryption::decide(oa, ob, &whyA), db = encryption::decide(ob, oa, &whyB);
        const std::string what =
            fmt::format("{} vs {} across={}", toString(a), toString(b), across);
        ASSERT_EQ(da.has_value(), db.has_value()) << what;
        if (!da) {
          // off against a side that requires: one line naming both settings.
          EXPECT_NE(whyA.find("SHOAL_ENCRYPT=off"), std::string::npos) << whyA;
          EXPECT_EQ(whyA.find('\n'), std::string::npos) << whyA;
          continue;
        }
        EXPECT_EQ(*da, *db) << what;
        const bool expected = a == EncryptMode::kOn || b == EncryptMode::kOn ||
                              (across && a == EncryptMode::kAuto && b == EncryptMode::kAuto);
        EXPECT_EQ(*da, expected) << what;
      }
    }
  }
  std::string why;
  EXPECT_FALSE(encryption::decide(encryption::makeOffer(EncryptMode::kAuto, false), {9, 9}, &why));
  EXPECT_NE(why.find("malformed"), std::string::npos);
}

TEST(EncryptSetting, KeysAreBoundToTheirPurpose) {
  const auto a = encryption::derivePsk("secret", "store");
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a, encryption::derivePsk("secret", "store"));
  EXPECT_NE(a, encryption::derivePsk("secret", "data|group 1|ranks 0-1"));
  EXPECT_NE(a, encryption::derivePsk("other secret", "store"));
  EXPECT_EQ(a.find("secret"), std::string::npos);
}

// ---- the TLS session on its own, over a socketpair

struct Pair {
  Fd a, b;
  Pair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
      throwSystemError("socketpair", errno);
    }
    a = Fd(sv[0]);
    b = Fd(sv[1]);
  }
};

// Runs the server's side on a thread; returns its error ("" = ok).
std::future<std::string> serveOn(int fd, std::string psk, std::function<void(tls::Session&)> body,
                                 Duration timeout = 10s) {
  return std::async(std::launch::async, [fd, psk, body, timeout] {
    try {
      tls::Session s(fd, tls::Session::Role::kServer, psk, "server");
      s.handshake(Deadline(timeout));
      body(s);
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
}

TEST(TlsSession, TheSameKeyCarriesBytesBothWays) {
  Pair p;
  const std::string psk = encryption::derivePsk("s", "test");
  const size_t n = (3 << 20) + 17;  // many records, the last one partial
  std::vector<uint8_t> sent(n);
  std::iota(sent.begin(), sent.end(), 0);
  auto server = serveOn(p.b.get(), psk, [&](tls::Session& s) {
    std::vector<uint8_t> got(n);
    s.readAll(got.data(), n, Deadline(30s));
    SHOAL_CHECK(got == sent, "the server received other bytes");
    s.writeAll(got.data(), n, Deadline(30s));
  });
  tls::Session c(p.a.get(), tls::Session::Role::kClient, psk, "client");
  c.handshake(Deadline(10s));
  std::vector<uint8_t> back(n);
  // Writes and reads interleaved: the socketpair's buffer holds far less than 3 MiB.
  auto writer = std::async(std::launch::async, [&] { c.writeAll(sent.data(), n, Deadline(30s)); });
  writer.get();
  c.readAll(back.data(), n, Deadline(30s));
  EXPECT_EQ(server.get(), "");
  EXPECT_EQ(back, sent);
}

TEST(TlsSession, KeysAreUpdatedAlongTheWay) {
  // A KeyUpdate every 3 records, 2 MiB each way (one direction, then the other: a Session is
  // used by one thread at a time): the receivers follow every change of key.
  Pair p;
  const std::string psk = encryption::derivePsk("s", "test");
  const size_t n = 2 << 20;
  std::vector<uint8_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<uint8_t>(i * 13);
    b[i] = static_cast<uint8_t>(i);
  }
  auto server = serveOn(p.b.get(), psk, [&](tls::Session& s) {
    s.rekeyEvery(3);
    std::vector<uint8_t> got(n);
    s.readAll(got.data(), n, Deadline(30s));
    SHOAL_CHECK(got == a, "the server received other bytes");
    s.writeAll(b.data(), n, Deadline(30s));
  });
  tls::Session c(p.a.get(), tls::Session::Role::kClient, psk, "client");
  c.handshake(Deadline(10s));
  c.rekeyEvery(3);
  c.writeAll(a.data(), n, Deadline(30s));
  std::vector<uint8_t> got(n);
  c.readAll(got.data(), n, Deadline(30s));
  EXPECT_EQ(server.get(), "");
  EXPECT_EQ(got, b);
}

TEST(TlsSession, RecordsReadAheadAreAnnouncedUntilReadOut) {
  // Note [Read ahead]: a reader that sleeps on the socket only when buffered() is false must
  // get every byte; were a record held inside OpenSSL unannounced, the wait would time out.
  Pair p;
  const std::string psk = encryption::derivePsk("s", "test");
  std::promise<void> readerDone;
  auto server = serveOn(p.b.get(), psk, [&](tls::Session& s) {
    for (char c : {'a', 'b', 'c'}) s.writeAll(std::string(100, c).data(), 100, Deadline(10s));
    readerDone.get_future().wait();  // keep the connection open: no end-of-file to wake on
  });
  tls::Session c(p.a.get(), tls::Session::Role::kClient, psk, "client");
  c.handshake(Deadline(10s));
  std::string got;
  while (got.size() < 300) {
    if (!c.buffered()) {
      ASSERT_TRUE(pollFor(p.a.get(), POLLIN, Deadline(5s)))
          << "bytes held unannounced after " << got.size();
    }
    char b;
    auto r = c.read(&b, 1);  // one byte at a time: records stay partly read
    ASSERT_NE(r.status, tls::Session::Status::kClosed);
    if (r.status == tls::Session::Status::kOk) got += b;
  }
  readerDone.set_value();
  EXPECT_EQ(server.get(), "");
  EXPECT_EQ(got, std::string(100, 'a') + std::string(100, 'b') + std::string(100, 'c'));
  EXPECT_FALSE(c.buffered());
}

TEST(TlsSession, AnotherKeyFailsBothEndsAtOnce) {
  Pair p;
  const auto start = Clock::now();
  auto server = serveOn(p.b.get(), encryption::derivePsk("right", "test"), [](tls::Session&) {});
  std::string clientError;
  try {
    tls::Session c(p.a.get(), tls::Session::Role::kClient, encryption::derivePsk("wrong", "test"),
                   "rank 1 → peer 0");
    c.handshake(Deadline(10s));
    // TLS 1.3: the client may finish before the server's verdict arrives; its first read then
    // gets the server's alert.
    char b;
    c.readAll(&b, 1, Deadline(10s));
  } catch (const Error& e) {
    clientError = e.what();
  }
  const std::string serverError = server.get();
  EXPECT_LT(Clock::now() - start, 5s) << "a wrong key must fail at once, not at a deadline";
  EXPECT_NE(clientError.find("rank 1 → peer 0"), std::string::npos) << clientError;
  EXPECT_FALSE(serverError.empty());
  EXPECT_EQ(clientError.find('\n'), std::string::npos) << clientError;
  EXPECT_EQ(serverError.find('\n'), std::string::npos) << serverError;
}

TEST(TlsSession, APeerThatDoesNotSpeakTlsFailsTheHandshake) {
  // Plain bytes (as a rank in clear would send a frame), then silence: an error, not a hang.
  {
    Pair p;
    const char junk[] = "SHOAL frame header, not a TLS record at all................";
    ASSERT_EQ(::send(p.b.get(), junk, sizeof(junk), MSG_NOSIGNAL), ssize_t(sizeof(junk)));
    tls::Session s(p.a.get(), tls::Session::Role::kServer, encryption::derivePsk("k", "t"), "srv");
    const auto start = Clock::now();
    EXPECT_THROW(s.handshake(Deadline(10s)), ProtocolError);
    EXPECT_LT(Clock::now() - start, 5s);
  }
  // A peer that closes: PeerError at once.
  {
    Pair p;
    p.b.reset();
    tls::Session s(p.a.get(), tls::Session::Role::kClient, encryption::derivePsk("k", "t"), "cli");
    EXPECT_THROW(s.handshake(Deadline(10s)), PeerError);
  }
  // A peer that says nothing: TimeoutError at the deadline.
  {
    Pair p;
    tls::Session s(p.a.get(), tls::Session::Role::kServer, encryption::derivePsk("k", "t"), "srv");
    const auto start = Clock::now();
    EXPECT_THROW(s.handshake(Deadline(300ms)), TimeoutError);
    EXPECT_LT(Clock::now() - start, 5s);
  }
}

// ---- data links between thread ranks

comm::GroupOptions encrypted(EncryptMode mode) {
  auto o = testOptions(TransportKind::kTcp, 60);
  o.encrypt = mode;
  return o;
}

TEST(EncryptedLinks, CollectivesAndPointToPointGiveTheRightResults) {
  for (int n : {2, 3}) {
    auto errors = runThreadRanks(n, encrypted(EncryptMode::kOn), [n](comm::Group& g) {
      for (int p = 0; p < n; ++p) {
        if (p != g.rank())
          SHOAL_CHECK(comm::nativeEngine(g).linkKind(p) == transport::LinkKind::kTls, "not TLS");
      }
      MatrixOptions m;
      m.lengths = {0, 1, 1003, 70001};
      m.types = {DataType::kFloat32, DataType::kInt64, DataType::kUInt8};
      m.ops = {ReduceOp::kSum, ReduceOp::kMax};
      auto failures = runMatrix(g, m);
      SHOAL_CHECK(failures.empty(), "{}", failures.empty() ? "" : failures[0]);
      // 24 MiB all-reduce: thousands of records each way, partial writes on full sockets.
      std::vector<float> big(6 << 20);
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>((i % 1000) + g.rank());
      comm::allreduce(g, big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < big.size(); i += 4099) {
        const float want = static_cast<float>(n * (i % 1000) + n * (n - 1) / 2);
        SHOAL_CHECK(big[i] == want, "all-reduce[{}] = {} (want {})", i, big[i], want);
      }
      // Tagged point-to-point: both directions at once, 16 MiB each, and a small message.
      const int right = (g.rank() + 1) % n, left = (g.rank() + n - 1) % n;
      std::vector<uint8_t> out(16 << 20), in(out.size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + g.rank());
      auto s = comm::isend(g, out.data(), out.size(), DataType::kUInt8, right, 5);
      auto r = comm::irecv(g, in.data(), in.size(), DataType::kUInt8, left, 5);
      int64_t tiny = 1000 + g.rank(), got = 0;
      auto s2 = comm::isend(g, &tiny, 1, DataType::kInt64, right, 6);
      auto r2 = comm::irecv(g, &got, 1, DataType::kInt64, left, 6);
      s->wait();
      r->wait();
      s2->wait();
      r2->wait();
      for (size_t i = 0; i < in.size(); i += 1021) {
        SHOAL_CHECK(in[i] == static_cast<uint8_t>(i * 7 + left), "p2p byte {}", i);
      }
      SHOAL_CHECK(got == 1000 + left, "p2p small message {}", got);
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "n=" << n << " rank " << r;
  }
}

TEST(EncryptedLinks, AutoLeavesOneHostInClear) {
  auto errors = runThreadRanks(2, encrypted(EncryptMode::kAuto), [](comm::Group& g) {
    SHOAL_CHECK(comm::nativeEngine(g).linkKind(1 - g.rank()) == transport::LinkKind::kTcp,
                "auto encrypted loopback");
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
}

TEST(EncryptedLinks, AnAbortingPeerIsNamedThroughTheRecords) {
  // A mismatch (different counts) aborts: the abort frame travels inside the TLS records, and
  // every rank reports the mismatch (who sent what) rather than a lost connection.
  auto errors = runThreadRanks(3, encrypted(EncryptMode::kOn), [](comm::Group& g) {
    const size_t count = g.rank() == 2 ? 100 : 77;
    std::vector<float> a(count, 1.0f);
    comm::allreduce(g, a.data(), count, DataType::kFloat32, ReduceOp::kSum);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("sent allreduce #0 of"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_EQ(errors[r].find("connection"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

// Two thread ranks with their own settings; returns each one's error and the time it took.
std::vector<std::string> mismatchedRanks(EncryptMode zero, EncryptMode one, Duration* took) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::string> errors(2);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto g = comm::Group::create(store, r, 2, encrypted(r == 0 ? zero : one));
        comm::barrier(*g);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  *took = Clock::now() - start;
  return errors;
}

TEST(EncryptedLinks, OneSideEncryptingAndTheOtherNotFailsAtOnceNamingThePeer) {
  for (auto [zero, one] : {std::pair{EncryptMode::kOff, EncryptMode::kOn},
                           std::pair{EncryptMode::kOn, EncryptMode::kOff}}) {
    Duration took{};
    auto errors = mismatchedRanks(zero, one, &took);
    // The group timeout is 60 s: failing within a few seconds means it never waited for it.
    EXPECT_LT(took, 10s);
    // Links are made on first use: either end may have dialed, and the peer of the one that
    // found the conflict adopts its account (cause: that rank).
    for (const auto& e : errors) {
      const bool namesPair = e.find("rank 0 ← peer 1") != std::string::npos ||
                             e.find("rank 0 → peer 1") != std::string::npos ||
                             e.find("rank 1 ← peer 0") != std::string::npos ||
                             e.find("rank 1 → peer 0") != std::string::npos;
      EXPECT_TRUE(namesPair) << e;
      EXPECT_NE(e.find("encryption settings disagree"), std::string::npos) << e;
      EXPECT_NE(e.find("SHOAL_ENCRYPT=off"), std::string::npos) << e;
      EXPECT_NE(e.find("SHOAL_ENCRYPT=on"), std::string::npos) << e;
      EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    }
  }
  // on against auto on one host: auto allows, so they encrypt.
  Duration took{};
  EXPECT_EQ(mismatchedRanks(EncryptMode::kOn, EncryptMode::kAuto, &took),
            std::vector<std::string>(2));
}

TEST(EncryptedLinks, AnotherKeyFailsTheLinkAtOnceNamingThePeer) {
  // The HMAC handshake keeps a wrong secret from getting this far in a job; should two ends
  // still derive different keys, the link fails in its TLS handshake, on both ends at once.
  Pair p;
  const std::string right = "right secret", wrong = "wrong secret";
  const auto start = Clock::now();
  auto acceptor = std::async(std::launch::async, [&]() -> std::string {
    try {
      transport::tcp::LinkSecurity s{EncryptMode::kOn, &right, 7, false, true};
      transport::tcp::secureTcpLink({0, 1}, std::move(p.b), s, Deadline(20s));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
  std::string connectorError;
  try {
    transport::tcp::LinkSecurity s{EncryptMode::kOn, &wrong, 7, true, true};
    auto link = transport::tcp::secureTcpLink({1, 0}, std::move(p.a), s, Deadline(20s));
    // TLS 1.3: the connector may finish before the acceptor's refusal arrives; its first read
    // then gets the alert (or the end of the connection).
    char b;
    const Deadline d(20s);
    while (link->readSome(&b, 1) == 0 && pollFor(link->socketFd(), POLLIN, d)) {
    }
  } catch (const std::exception& e) {
    connectorError = e.what();
  }
  const std::string acceptorError = acceptor.get();
  EXPECT_LT(Clock::now() - start, 5s) << "the 20 s deadline should not be what ended it";
  EXPECT_NE(acceptorError.find("rank 0 ← peer 1"), std::string::npos) << acceptorError;
  EXPECT_NE(connectorError.find("rank 1"), std::string::npos) << connectorError;
  EXPECT_NE(connectorError.find("peer 0"), std::string::npos) << connectorError;
  EXPECT_EQ(acceptorError.find('\n'), std::string::npos) << acceptorError;
  EXPECT_EQ(connectorError.find('\n'), std::string::npos) << connectorError;
}

// ---- the store over TLS

store::TcpStoreServerOptions storeOptions(EncryptMode mode) {
  store::TcpStoreServerOptions o;
  o.secret = "store-secret";
  o.encrypt = mode;
  o.handshakeTimeout = 2s;
  return o;
}

TEST(EncryptedStore, EveryRequestWorksOverTls) {
  store::TcpStoreServer server("127.0.0.1", 0, storeOptions(EncryptMode::kOn));
  const HostPort at{"127.0.0.1", server.port()};
  store::TcpStore a(at, 10s, "store-secret", EncryptMode::kOn);
  store::TcpStore b(at, 10s, "store-secret", EncryptMode::kAuto);  // allows: the server requires
  a.set("k", "v");
  EXPECT_EQ(b.get("k", 5s), "v");
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", 2), 7);
  EXPECT_EQ(a.compareSet("k", "v", "w"), "w");
  // Values larger than a record, and a parked get answered by another client's set.
  const std::string big(700 << 10, 'x');
  std::string got;
  std::thread getter([&] { got = b.get("big", 10s); });
  a.set("big", big);
  getter.join();
  EXPECT_EQ(got, big);
  a.wait({"k", "big"}, 5s);
  EXPECT_TRUE(b.check({"n"}));
  EXPECT_TRUE(b.deleteKey("n"));
  EXPECT_FALSE(a.check({"n"}));
  // Over the limit: refused in one line, and the encrypted connection stays in step.
  try {
    a.set("huge", std::string(2 << 20, 'y'));
    ADD_FAILURE() << "an oversize value was accepted";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the store's limit"), std::string::npos);
  }
  EXPECT_EQ(a.get("k", 5s), "w");
}

TEST(EncryptedStore, MismatchedSettingsFailAtOnceInOneLine) {
  for (auto [server, client] : {std::pair{EncryptMode::kOn, EncryptMode::kOff},
                                std::pair{EncryptMode::kOff, EncryptMode::kOn}}) {
    store::TcpStoreServer s("127.0.0.1", 0, storeOptions(server));
    store::TcpStore c(HostPort{"127.0.0.1", s.port()}, 30s, "store-secret", client);
    const auto start = Clock::now();
    try {
      c.set("k", "v");
      ADD_FAILURE() << "a conflicting client was served";
    } catch (const StoreError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(fmt::format("store 127.0.0.1:{}", s.port())), std::string::npos) << what;
      EXPECT_NE(what.find("encryption settings disagree"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_LT(Clock::now() - start, 5s) << "not retried until the 30 s deadline";
  }
  // No secret, no key: a store server set to on refuses to start, a client set to on refuses
  // an unauthenticated store.
  store::TcpStoreServerOptions open;
  open.encrypt = EncryptMode::kOn;
  EXPECT_THROW(store::TcpStoreServer("127.0.0.1", 0, open), InvalidArgument);
  store::TcpStoreServer openServer("127.0.0.1", 0);
  store::TcpStore c(HostPort{"127.0.0.1", openServer.port()}, 5s, "", EncryptMode::kOn);
  EXPECT_THROW(c.set("k", "v"), StoreError);
  // auto stays in clear with an unauthenticated store (nothing to key TLS with).
  store::TcpStore(HostPort{"127.0.0.1", openServer.port()}, 5s, "", EncryptMode::kAuto)
      .set("k", "v");
}

TEST(EncryptedStore, AStalledHandshakeNeverDelaysOtherClients) {
  auto o = storeOptions(EncryptMode::kOn);
  o.handshakeTimeout = 4s;
  store::TcpStoreServer server("127.0.0.1", 0, o);
  const HostPort at{"127.0.0.1", server.port()};
  // Proves the secret, agrees to encrypt, then never sends its TLS hello.
  Fd stalled = connectTcp(at, Deadline(5s), "stalled");
  auth::connect(stalled.get(), "store-secret", auth::Channel::kStore, 0, -1, -1, Deadline(5s),
                "stalled");
  ASSERT_TRUE(encryption::negotiate(stalled.get(), EncryptMode::kOn, false, Deadline(5s), "s"));
  // Another that agrees to encrypt and then talks in clear is dropped, not served.
  Fd liar = connectTcp(at, Deadline(5s), "liar");
  auth::connect(liar.get(), "store-secret", auth::Channel::kStore, 0, -1, -1, Deadline(5s), "liar");
  ASSERT_TRUE(encryption::negotiate(liar.get(), EncryptMode::kOn, false, Deadline(5s), "l"));
  const std::string clear = "clear request bytes where a TLS ClientHello belongs..............";
  ASSERT_EQ(::send(liar.get(), clear.data(), clear.size(), MSG_NOSIGNAL), ssize_t(clear.size()));
  // Meanwhile a real client is served: before the stalled handshake ends (by its deadline),
  // so it did not wait for it.
  store::TcpStore good(at, 10s, "store-secret", EncryptMode::kOn);
  good.set("a", "1");
  EXPECT_EQ(good.get("a", 1s), "1");
  // Whether a socket has been closed by the server, waiting up to `wait`.
  auto closedWithin = [](int fd, Duration wait) {
    pollfd p{fd, POLLIN, 0};
    char b[256];
    const Deadline d(wait);
    for (;;) {
      if (::poll(&p, 1, d.remainingMs()) <= 0) return false;
      const ssize_t r = ::recv(fd, b, sizeof(b), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
  };
  EXPECT_FALSE(closedWithin(stalled.get(), 0s)) << "served only after the stalled handshake ended";
  // Both are closed: the liar at once, the stalled one at its handshake deadline.
  EXPECT_TRUE(closedWithin(liar.get(), 20s));
  EXPECT_TRUE(closedWithin(stalled.get(), 20s));
}

// ---- real processes: the collective matrix over TLS, and a rank set apart

run::LocalJobOptions workerJob(int n, std::string scenario, const TempDir& dir,
                               std::vector<std::pair<std::string, std::string>> env) {
  run::LocalJobOptions o;
  o.ranks = n;
  o.argv = {SHOAL_TEST_WORKER, std::move(scenario)};
  o.env = std::move(env);
  o.outputDir = dir.path;
  return o;
}

TEST(EncryptedProcesses, TheCollectiveMatrixPassesOverTls) {
  TempDir dir;
  const int n = 3;
  run::LocalJob j(
      workerJob(n, "matrix", dir, {{"SHOAL_TRANSPORT", "tcp"}, {"SHOAL_ENCRYPT", "1"}}));
  bool timedOut = false;
  auto exits = j.wait(300s, &timedOut);
  ASSERT_FALSE(timedOut);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(exits[r].ok()) << exits[r].describe() << "\n" << j.output(r);
    EXPECT_NE(j.output(r).find("matrix done over tls, 0 failures"), std::string::npos)
        << j.output(r);
  }
}

TEST(EncryptedProcesses, ARankWithAnotherSettingFailsEveryRankInOneLine) {
  TempDir dir;
  auto o = workerJob(2, "loop", dir, {{"SHOAL_TRANSPORT", "tcp"}, {"SHOAL_TIMEOUT", "60"}});
  o.argv.push_back("barrier");
  o.rankEnv = [](int r) {
    return std::vector<std::pair<std::string, std::string>>{{"SHOAL_ENCRYPT", r == 0 ? "0" : "1"}};
  };
  const auto start = Clock::now();
  run::LocalJob j(o);
  bool timedOut = false;
  auto exits = j.wait(120s, &timedOut);
  ASSERT_FALSE(timedOut);
  EXPECT_LT(Clock::now() - start, 30s) << "the 60 s timeout should not be what ended it";
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(exits[r].ok());
    const std::string out = j.output(r);
    EXPECT_NE(out.find("encryption settings disagree"), std::string::npos) << out;
    EXPECT_NE(out.find(r == 0 ? "peer 1" : "peer 0"), std::string::npos) << out;
  }
}

TEST(EncryptedProcesses, ABadSettingExitsWithCode2) {
  TempDir dir;
  run::LocalJob j(workerJob(1, "matrix", dir, {{"SHOAL_ENCRYPT", "sometimes"}}));
  auto exits = j.wait(60s);
  EXPECT_EQ(exits[0].exitCode, 2) << j.output(0);
  EXPECT_NE(j.output(0).find("SHOAL_ENCRYPT='sometimes': expected 0, off, 1, on or auto"),
            std::string::npos)
      << j.output(0);
}

}  // namespace
}  // namespace shoal::test
