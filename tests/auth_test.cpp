#include "transport/auth.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "comm/collectives.h"
#include "common/env.h"
#include "common/error.h"
#include "common/socket.h"
#include "tests/thread_ranks.h"

namespace shoal {
namespace {

using namespace std::chrono_literals;

// Runs both handshake sides over a socketpair; returns {connector error, acceptor error}.
std::pair<std::string, std::string> handshake(const std::string& connectorSecret,
                                              const std::string& acceptorSecret) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  Fd a(sv[0]), b(sv[1]);
  std::string connectorError, acceptorError;
  std::thread acceptor([&] {
    try {
      EXPECT_EQ(transport::authenticateAcceptor(b.get(), acceptorSecret, 9, 0, 2, Deadline(2s)), 1);
    } catch (const Error& e) {
      acceptorError = e.what();
      b.reset();
    }
  });
  try {
    transport::authenticateConnector(a.get(), connectorSecret, 9, 1, 0, Deadline(2s));
  } catch (const Error& e) {
    connectorError = e.what();
  }
  acceptor.join();
  return {connectorError, acceptorError};
}

// A dial to a port nobody listens on any more can be given that very port as its source port and
// connect to itself (TCP simultaneous open); the dialers (connectTcp, the mesh's dial) must tell
// it from a listener, or they wait for a greeting that never comes (a 60 s wait seen in CI).
// Here the self-connection is made on purpose: bound to the port it connects to.
TEST(Sockets, ASocketConnectedToItselfIsToldApart) {
  int port = 0;
  { Fd probe = listenTcp("127.0.0.1", 0, &port); }  // a port nobody listens on now
  Fd self(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(self.valid());
  int one = 1;
  ASSERT_EQ(::setsockopt(self.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::bind(self.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0)
      << std::strerror(errno);
  ASSERT_EQ(::connect(self.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0)
      << "a socket bound to the port it connects to, with no listener, connects to itself: "
      << std::strerror(errno);
  EXPECT_TRUE(isSelfConnected(self.get()));

  // A real connection is not.
  int listening = 0;
  Fd listener = listenTcp("127.0.0.1", 0, &listening);
  Fd client = connectTcp({"127.0.0.1", listening}, Deadline(5s), "test");
  Fd server = acceptTcp(listener.get(), Deadline(5s), "test");
  EXPECT_FALSE(isSelfConnected(client.get()));
  EXPECT_FALSE(isSelfConnected(server.get()));
  EXPECT_FALSE(isSelfConnected(listener.get()));  // not connected at all
}

TEST(Auth, SameSecretPasses) {
  auto [c, a] = handshake("s3cret", "s3cret");
  EXPECT_EQ(c, "");
  EXPECT_EQ(a, "");
}

TEST(Auth, WrongSecretFailsOnBothSides) {
  auto [c, a] = handshake("guess", "s3cret");
  EXPECT_NE(c.find("secret"), std::string::npos) << c;
  EXPECT_FALSE(a.empty());
}

TEST(Auth, RogueConnectionsAreRejectedAndTheGroupStillForms) {
  auto store = std::make_shared<store::MemoryStore>();
  auto options = test::testOptions(TransportKind::kTcp, 20);
  // Rogues knock on rank 0: one sends garbage, one a well-formed hello with the wrong secret,
  // one the right secret for another group. Rank 1 joins for real at the same time. (The exact
  // refusals are checked in bootstrap_test.cpp, where the attack is ordered before the peers.)
  std::string liarOutcome, strangerOutcome;
  std::thread rogue([&] {
    auto addr = store->get("shoal/g0/peer/0", 10s);
    HostPort hp = parseHostPort(addr.substr(0, addr.find('|')));
    try {
      Fd junk = connectTcp(hp, Deadline(2s), "rogue");
      std::string garbage(64, 'x');
      writeAll(junk.get(), garbage.data(), garbage.size(), Deadline(1s), "rogue");
    } catch (const Error&) {
      // The group may already have formed and closed its listener.
    }
    auto attempt = [&](const std::string& secret, uint32_t group, std::string& outcome) {
      try {
        // Once the group formed the listener is gone: refused is a fine outcome too.
        Fd conn = connectTcp(hp, Deadline(2s), "rogue");
        transport::authenticateConnector(conn.get(), secret, group, 1, 0, Deadline(10s));
        outcome = "accepted";
      } catch (const Error&) {
        // Refused, or closed unanswered once the group formed: either way not let in.
        outcome = "refused";
      }
    };
    attempt("not the secret", 0, liarOutcome);
    attempt(options.secret.value(), 12345, strangerOutcome);
  });
  std::vector<std::string> errors(2);
  std::thread rank0([&] {
    try {
      auto g = comm::Group::create(store, 0, 2, options);
      int64_t v = 1;
      comm::allreduce(*g, &v, 1, DataType::kInt64, ReduceOp::kSum);
      EXPECT_EQ(v, 3);
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  try {
    auto g = comm::Group::create(store, 1, 2, options);
    int64_t v = 2;
    comm::allreduce(*g, &v, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(v, 3);
  } catch (const std::exception& e) {
    errors[1] = e.what();
  }
  rank0.join();
  rogue.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(liarOutcome, "refused");
  EXPECT_EQ(strangerOutcome, "refused");
}

TEST(Auth, AnImpostorAcceptorIsDetectedByTheConnector) {
  // The acceptor does not know the secret: the connector's proof fails there first, so the
  // connector is told "wrong job secret?" and never accepts the impostor.
  auto [c, a] = handshake("s3cret", "impostor");
  EXPECT_NE(c.find("authentication failed"), std::string::npos) << c;
  EXPECT_NE(a.find("wrong secret"), std::string::npos) << a;
}

TEST(Auth, AStoreProofCannotOpenADataConnection) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  Fd a(sv[0]), b(sv[1]);
  std::string acceptorError;
  std::thread acceptor([&] {
    try {
      transport::authenticateAcceptor(b.get(), "s3cret", 0, 0, 2, Deadline(5s));
    } catch (const Error& e) {
      acceptorError = e.what();
    }
  });
  EXPECT_THROW(auth::connect(a.get(), "s3cret", auth::Channel::kStore, 0, 1, 0, Deadline(5s), "t"),
               ProtocolError);
  acceptor.join();
  EXPECT_NE(acceptorError.find("channel"), std::string::npos) << acceptorError;
}

TEST(Env, MalformedValuesNameTheVariable) {
  ::setenv("SHOAL_TIMEOUT", "soon", 1);
  try {
    readEnvConfig();
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SHOAL_TIMEOUT"), std::string::npos);
  }
  ::setenv("SHOAL_TIMEOUT", "2.5", 1);
  ::setenv("SHOAL_TRANSPORT", "carrier-pigeon", 1);
  EXPECT_THROW(readEnvConfig(), InvalidArgument);
  ::setenv("SHOAL_TRANSPORT", "shm", 1);
  auto c = readEnvConfig();
  EXPECT_EQ(c.timeoutSeconds, 2.5);
  EXPECT_EQ(c.transport, TransportKind::kShm);
  ::unsetenv("SHOAL_TIMEOUT");
  ::unsetenv("SHOAL_TRANSPORT");
}

TEST(Groups, GeneratedSecretIsSharedOnOneHostAndSegmentsAreReleased) {
  auto count = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) n += line.find("memfd:shoal") != std::string::npos;
    return n;
  };
  const int before = count();
  {
    auto options = test::testOptions(TransportKind::kShm, 20);
    options.secret.reset();  // rank 0 generates one and shares it through a memfd
    auto errors = test::runThreadRanks(3, options, [](comm::Group& g) {
      int32_t v = g.rank();
      comm::allreduce(g, &v, 1, DataType::kInt32, ReduceOp::kSum);
      EXPECT_EQ(v, 3);
    });
    for (auto& e : errors) EXPECT_EQ(e, "");
  }
  EXPECT_EQ(count(), before) << "shared segments still mapped after the groups were destroyed";
}

}  // namespace
}  // namespace shoal
