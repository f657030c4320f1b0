#include "transport/auth.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

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
  // Rogues knock on rank 0 first: one sends garbage, one a well-formed hello with the wrong
  // secret. Then rank 1 joins for real.
  std::thread rogue([&] {
    auto addr = store->get("shoal/peer/0", 10s);
    HostPort hp = parseHostPort(addr.substr(0, addr.find('|')));
    Fd junk = connectTcp(hp, Deadline(2s), "rogue");
    std::string garbage(64, 'x');
    writeAll(junk.get(), garbage.data(), garbage.size(), Deadline(1s), "rogue");
    Fd liar = connectTcp(hp, Deadline(2s), "rogue");
    EXPECT_THROW(
        transport::authenticateConnector(liar.get(), "not the secret", 0, 1, 0, Deadline(2s)),
        Error);
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
  rogue.join();
  try {
    auto g = comm::Group::create(store, 1, 2, options);
    int64_t v = 2;
    comm::allreduce(*g, &v, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(v, 3);
  } catch (const std::exception& e) {
    errors[1] = e.what();
  }
  rank0.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
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
