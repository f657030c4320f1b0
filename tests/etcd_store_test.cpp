// The store contract on a real etcd (store/etcd_store.h). Started by tests/etcd/etcd_test.sh,
// which runs etcd in a private network namespace and passes its URL in SHOAL_TEST_ETCD.
#include "store/etcd_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/membership.h"
#include "common/error.h"
#include "common/socket.h"

namespace shoal::store {
namespace {

std::shared_ptr<EtcdStore> connect(const std::string& ns) {
  const char* url = std::getenv("SHOAL_TEST_ETCD");
  if (url == nullptr) {
    ADD_FAILURE() << "SHOAL_TEST_ETCD is not set: run tests/etcd/etcd_test.sh";
    return nullptr;
  }
  auto a = EtcdAddress::parse(url);
  a.ns += "/" + ns;
  // tests/etcd/etcd_test.sh runs the contract again with etcd's authentication on, and
  // tests/etcd/etcd_tls_test.sh over etcds:// with SHOAL_ETCD_CACERT (and a client certificate).
  return std::make_shared<EtcdStore>(a, std::chrono::seconds(10),
                                     EtcdCredentials::fromEnvironment(processEnvReader()),
                                     EtcdTls::fromEnvironment(processEnvReader()));
}

TEST(EtcdStore, SetGetCheckDelete) {
  auto s = connect("basic");
  ASSERT_TRUE(s);
  const std::string binary("a\0b\xff\n", 5);
  s->set("k", binary);
  EXPECT_EQ(s->get("k", std::chrono::seconds(1)), binary);
  EXPECT_TRUE(s->check({"k"}));
  EXPECT_FALSE(s->check({"k", "missing"}));
  EXPECT_TRUE(s->deleteKey("k"));
  EXPECT_FALSE(s->deleteKey("k"));
  EXPECT_FALSE(s->check({"k"}));
  try {
    s->get("missing", std::chrono::milliseconds(200));
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(EtcdStore, AddFromManyClientsIsExact) {
  auto s = connect("add");
  ASSERT_TRUE(s);
  std::vector<std::future<void>> clients;
  for (int c = 0; c < 4; ++c) {
    clients.push_back(std::async(std::launch::async, [&] {
      auto mine = connect("add");  // its own connections, as another process would have
      for (int i = 0; i < 25; ++i) mine->add("n", 1);
    }));
  }
  for (auto& c : clients) c.get();
  EXPECT_EQ(s->add("n", 0), 100);
  EXPECT_EQ(s->add("n", -100), 0);
  s->set("text", "x");
  EXPECT_THROW(s->add("text", 1), StoreError);
}

TEST(EtcdStore, CompareSet) {
  auto s = connect("cas");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->compareSet("c", "", "one"), "one");  // absent equals ""
  EXPECT_EQ(s->compareSet("c", "", "two"), "one");  // present: unchanged, the value returned
  EXPECT_EQ(s->compareSet("c", "zzz", "two"), "one");
  EXPECT_EQ(s->compareSet("c", "one", "two"), "two");
  EXPECT_EQ(s->get("c", std::chrono::seconds(1)), "two");
}

TEST(EtcdStore, MembersAgreeOnAViewThroughEtcd) {
  auto s = connect("membership");
  ASSERT_TRUE(s);
  comm::MembershipOptions o;
  o.range = {2, 3};
  o.initialSize = 3;
  std::vector<std::future<std::string>> members;
  for (int id = 0; id < 3; ++id) {
    members.push_back(std::async(std::launch::async, [&, id] {
      comm::Membership m(connect("membership"), id, o);
      return m.next(-1).encode();
    }));
  }
  const std::string first = members[0].get();
  EXPECT_EQ(members[1].get(), first);
  EXPECT_EQ(members[2].get(), first);
  EXPECT_EQ(comm::View::decode(first, "view").size(), 3);
}

TEST(EtcdStore, UnreachableIsAStoreErrorNamingTheAddress) {
  EtcdStore s(EtcdAddress::parse("etcd://127.0.0.1:1/x"), std::chrono::milliseconds(300));
  try {
    s.set("k", "v");
    FAIL() << "no error";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(EtcdAddress::parse("etcd://host"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("etcd://host:2379/"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("http://host:2379"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("https://host:2379"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("etcds://host"), InvalidArgument);
  EXPECT_EQ(EtcdAddress::parse("etcd://h:2379/a/b").ns, "a/b");
  EXPECT_FALSE(EtcdAddress::parse("etcd://h:2379/a/b").tls);
  const auto secure = EtcdAddress::parse("etcds://h:2379/a");
  EXPECT_TRUE(secure.tls);
  EXPECT_EQ(secure.address.host, "h");
  EXPECT_EQ(secure.address.port, 2379);
  EXPECT_EQ(secure.ns, "a");
  EXPECT_TRUE(EtcdAddress::matches("etcds://h:1"));
}

// Run by tests/etcd/etcd_tls_test.sh against a TLS etcd that must refuse this client's
// connection (SHOAL_TEST_ETCD and the SHOAL_ETCD_* TLS variables say how): the refusal is one
// line of the kind SHOAL_TEST_ETCD_REFUSAL_KIND (StoreError or InvalidArgument) that matches
// the regular expression SHOAL_TEST_ETCD_REFUSAL and names the address, and comes at once (a
// verification failure is not retried until the request's deadline).
TEST(EtcdStoreTlsRefusal, IsOneLineNamingTheAddressAndTheReason) {
  const char* url = std::getenv("SHOAL_TEST_ETCD");
  const char* expected = std::getenv("SHOAL_TEST_ETCD_REFUSAL");
  const char* kind = std::getenv("SHOAL_TEST_ETCD_REFUSAL_KIND");
  ASSERT_TRUE(url != nullptr && expected != nullptr && kind != nullptr)
      << "run by tests/etcd/etcd_tls_test.sh";
  const auto address = EtcdAddress::parse(url);
  const auto start = std::chrono::steady_clock::now();
  try {
    EtcdStore s(address, std::chrono::seconds(20),
                EtcdCredentials::fromEnvironment(processEnvReader()),
                EtcdTls::fromEnvironment(processEnvReader()));
    s.set("refused", "v");
    FAIL() << "no error: the store accepted " << url;
  } catch (const Error& e) {
    const std::string what = e.what();
    std::cout << "refused: " << what << "\n";
    const std::string actualKind = dynamic_cast<const StoreError*>(&e)        ? "StoreError"
                                   : dynamic_cast<const InvalidArgument*>(&e) ? "InvalidArgument"
                                                                              : "another kind";
    EXPECT_EQ(actualKind, kind) << what;
    EXPECT_TRUE(std::regex_search(what, std::regex(expected)))
        << what << "\ndoes not match " << expected;
    EXPECT_NE(what.find(address.address.str()), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// One POST to etcd's gateway, its whole reply (status line, headers, body).
std::string rawPost(const HostPort& at, const std::string& path, const std::string& body,
                    const std::string& token) {
  const Deadline deadline(std::chrono::seconds(10));
  Fd fd = connectTcp(at, deadline, "etcd");
  const std::string request = fmt::format(
      "POST {} HTTP/1.1\r\nHost: {}\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n{}", path,
      at.str(), token.empty() ? "" : "Authorization: " + token + "\r\n", body.size(), body);
  writeAll(fd.get(), request.data(), request.size(), deadline, "etcd");
  std::string reply;
  char buf[4096];
  while (pollFor(fd.get(), POLLIN, deadline)) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  return reply;
}

// Run by tests/etcd/etcd_test.sh once etcd's authentication is on, with SHOAL_ETCD_USER and
// SHOAL_ETCD_PASSWORD_FILE naming its user: no credentials and a wrong password are one-line
// StoreErrors saying what to do; the right ones work (the rest of the contract runs with them).
TEST(EtcdStoreAuth, NoOrWrongCredentialsAreStoreErrorsSayingSo) {
  const char* url = std::getenv("SHOAL_TEST_ETCD");
  const auto good = EtcdCredentials::fromEnvironment(processEnvReader());
  ASSERT_TRUE(url != nullptr && !good.empty())
      << "run by tests/etcd/etcd_test.sh with SHOAL_ETCD_USER and SHOAL_ETCD_PASSWORD_FILE";
  const auto address = EtcdAddress::parse(url);
  auto expectRefused = [&](const EtcdCredentials& c, const std::string& expected) {
    EtcdStore s(address, std::chrono::seconds(10), c);
    try {
      s.set("auth-k", "v");
      FAIL() << "no error";
    } catch (const StoreError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(expected), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  expectRefused({}, "etcd has authentication on: set SHOAL_ETCD_USER and SHOAL_ETCD_PASSWORD_FILE");
  expectRefused({good.user, good.password + "x"}, "etcd refused user '" + good.user + "'");
  EtcdStore s(address, std::chrono::seconds(10), good);
  s.set("auth-k", "v");
  EXPECT_EQ(s.get("auth-k", std::chrono::seconds(1)), "v");

  // Turning authentication off and on again drops every token etcd gave out (as expiry does):
  // the store's next request is refused, it authenticates again and goes on.
  const std::string auth =
      rawPost(address.address, "/v3/auth/authenticate",
              nlohmann::json{{"name", good.user}, {"password", good.password}}.dump(), "");
  const std::string token = nlohmann::json::parse(auth.substr(auth.find('{'))).at("token");
  EXPECT_NE(rawPost(address.address, "/v3/auth/disable", "{}", token).find(" 200 "),
            std::string::npos);
  EXPECT_NE(rawPost(address.address, "/v3/auth/enable", "{}", "").find(" 200 "), std::string::npos);
  s.set("auth-k", "w");
  EXPECT_EQ(s.get("auth-k", std::chrono::seconds(1)), "w");
}

TEST(EtcdCredentials, ComeFromTheEnvironmentWithAPasswordFile) {
  auto env = [](std::map<std::string, std::string> m) -> EnvReader {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  EXPECT_TRUE(EtcdCredentials::fromEnvironment(env({})).empty());
  const std::string file = ::testing::TempDir() + "/etcd-password";
  { std::ofstream(file) << "s3cret\nignored\n"; }
  auto c = EtcdCredentials::fromEnvironment(
      env({{"SHOAL_ETCD_USER", "u"}, {"SHOAL_ETCD_PASSWORD_FILE", file}}));
  EXPECT_EQ(c.user, "u");
  EXPECT_EQ(c.password, "s3cret");
  EXPECT_EQ(EtcdCredentials::fromEnvironment(
                env({{"SHOAL_ETCD_USER", "u"}, {"SHOAL_ETCD_PASSWORD", "p"}}))
                .password,
            "p");
  EXPECT_THROW(EtcdCredentials::fromEnvironment(env({{"SHOAL_ETCD_USER", "u"}})), InvalidArgument);
  EXPECT_THROW(EtcdCredentials::fromEnvironment(env({{"SHOAL_ETCD_PASSWORD", "p"}})),
               InvalidArgument);
  EXPECT_THROW(EtcdCredentials::fromEnvironment(
                   env({{"SHOAL_ETCD_USER", "u"}, {"SHOAL_ETCD_PASSWORD_FILE", "/no/such/file"}})),
               InvalidArgument);
  { std::ofstream(file) << std::string(5000, 'x'); }
  EXPECT_THROW(EtcdCredentials::fromEnvironment(
                   env({{"SHOAL_ETCD_USER", "u"}, {"SHOAL_ETCD_PASSWORD_FILE", file}})),
               InvalidArgument);
}

// The TLS variables, read like the credentials: each file must be readable, a client
// certificate needs its key, and any of them with a plain etcd:// URL is refused.
TEST(EtcdTls, ComesFromTheEnvironment) {
  auto env = [](std::map<std::string, std::string> m) -> EnvReader {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no InvalidArgument";
  };
  EXPECT_TRUE(EtcdTls::fromEnvironment(env({})).empty());
  const std::string ca = ::testing::TempDir() + "/etcd-ca.pem";
  const std::string cert = ::testing::TempDir() + "/etcd-client.pem";
  const std::string key = ::testing::TempDir() + "/etcd-client.key";
  for (const auto& f : {ca, cert, key}) std::ofstream(f) << "pem\n";

  auto t = EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_CACERT", ca}}));
  EXPECT_EQ(t.caFile, ca);
  EXPECT_TRUE(t.certFile.empty() && t.keyFile.empty());
  EXPECT_EQ(t.variables(), "SHOAL_ETCD_CACERT");
  t = EtcdTls::fromEnvironment(
      env({{"SHOAL_ETCD_CACERT", ca}, {"SHOAL_ETCD_CERT", cert}, {"SHOAL_ETCD_KEY", key}}));
  EXPECT_EQ(t.certFile, cert);
  EXPECT_EQ(t.keyFile, key);
  EXPECT_EQ(t.variables(), "SHOAL_ETCD_CACERT, SHOAL_ETCD_CERT, SHOAL_ETCD_KEY");
  // A client certificate without a CA: the system's trust store checks etcd's.
  EXPECT_TRUE(EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_CERT", cert}, {"SHOAL_ETCD_KEY", key}}))
                  .caFile.empty());

  EXPECT_EQ(message([&] {
              EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_CERT", cert}}));
            }),
            "SHOAL_ETCD_CERT is set without SHOAL_ETCD_KEY: a client certificate needs both the "
            "certificate and its key");
  EXPECT_EQ(message([&] {
              EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_KEY", key}}));
            }),
            "SHOAL_ETCD_KEY is set without SHOAL_ETCD_CERT: a client certificate needs both the "
            "certificate and its key");
  EXPECT_EQ(message([&] {
              EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_CACERT", ""}}));
            }),
            "SHOAL_ETCD_CACERT is set but empty: expected a PEM file");
  EXPECT_EQ(message([&] {
              EtcdTls::fromEnvironment(env({{"SHOAL_ETCD_CACERT", "/no/such/ca.pem"}}));
            }),
            "SHOAL_ETCD_CACERT=/no/such/ca.pem: cannot be read");

  // With a plain URL: refused, naming what is set, before any connection.
  const auto plain = EtcdAddress::parse("etcd://127.0.0.1:1/x");
  EXPECT_NO_THROW(EtcdTls{}.checkFor(plain));
  EXPECT_EQ(message([&] {
              EtcdStore(plain, std::chrono::seconds(1), {}, EtcdTls{ca, "", ""});
            }),
            "SHOAL_ETCD_CACERT set for the plain-HTTP etcd store etcd://127.0.0.1:1: use "
            "etcds://127.0.0.1:1 for TLS, or unset them");
  EXPECT_NO_THROW(t.checkFor(EtcdAddress::parse("etcds://127.0.0.1:1/x")));
  // Files that are not PEM: refused when the store loads them, naming the file.
  const auto secure = EtcdAddress::parse("etcds://127.0.0.1:1/x");
  EXPECT_NE(message([&] {
              EtcdStore(secure, std::chrono::seconds(1), {}, EtcdTls{ca, "", ""});
            }).find("TLS CA file " + ca),
            std::string::npos);
}

// The TLS handshake is bounded by the request timeout: a server that accepts the connection and
// never answers (its listen backlog completes the TCP handshake; nothing accepts) is a StoreError
// after the timeout. And a server that does not speak TLS is refused at once (not retried).
TEST(EtcdTls, HandshakeHasTheRequestDeadlineAndANonTlsServerIsRefused) {
  int port = 0;
  Fd silent = listenTcp("127.0.0.1", 0, &port);
  EtcdStore quiet(EtcdAddress::parse(fmt::format("etcds://127.0.0.1:{}/x", port)),
                  std::chrono::milliseconds(300));
  auto start = std::chrono::steady_clock::now();
  try {
    quiet.set("k", "v");
    FAIL() << "no error";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("etcds://127.0.0.1:{}", port)), std::string::npos) << what;
    EXPECT_NE(what.find("timed out after 0.3 s in the TLS handshake"), std::string::npos) << what;
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(3));

  Fd plain = listenTcp("127.0.0.1", 0, &port);
  std::thread server([&] {
    // One connection answered in plain HTTP; the client gives up at once, so no other comes.
    Fd c = acceptTcp(plain.get(), Deadline(std::chrono::seconds(10)), "test server");
    const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    writeAll(c.get(), reply.data(), reply.size(), Deadline(std::chrono::seconds(10)), "test");
    char byte;
    pollFor(c.get(), POLLIN, Deadline(std::chrono::seconds(10)));  // until the client closes
    (void)::read(c.get(), &byte, 1);
  });
  EtcdStore http(EtcdAddress::parse(fmt::format("etcds://127.0.0.1:{}/x", port)),
                 std::chrono::seconds(10));
  start = std::chrono::steady_clock::now();
  try {
    http.set("k", "v");
    FAIL() << "no error";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("etcds://127.0.0.1:{}: TLS: ", port)), std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  server.join();
}

}  // namespace
}  // namespace shoal::store
