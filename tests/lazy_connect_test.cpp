// Connections made on first use between a pair (transport/mesh.h): only pairs that talk are
// connected, a simultaneous first use from both ends makes one connection, a first use from a
// receive connects too, and a peer that is gone, aborted or never came is named at once.
//
// Waits are store keys, condition variables and the library's own deadlines; timings are only
// generous upper bounds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/collectives.h"
#include "comm/group.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "store/memory_store.h"
#include "tests/thread_ranks.h"
#include "transport/acceptor.h"
#include "transport/endpoint.h"

namespace shoal {
namespace {

using namespace std::chrono_literals;
using transport::Transfer;

// Every rank of `n` adds itself to `name` and waits for all (a barrier with a deadline).
void storeBarrier(store::Store& s, const std::string& name, int n) {
  if (s.add("barrier/" + name, 1) == n) s.set("barrier/" + name + "/done", "1");
  s.wait({"barrier/" + name + "/done"}, 60s);
}

// One batch in group g: send `out` to each of `to`, receive into `in` from each of `from`
// (all bytes equal in size), as the group's own endpoint moves them (no point-to-point channel).
void exchange(comm::Group& g, const std::vector<int>& to, const void* out,
              const std::vector<int>& from, std::vector<std::vector<uint8_t>>& in, size_t bytes) {
  comm::execute(g, comm::op::kInternal, transport::FrameHeader{}, {}, [&](comm::OpContext& ctx) {
    std::vector<Transfer> batch;
    for (int p : to) batch.push_back(ctx.send(p, 0, out, bytes));
    in.assign(from.size(), std::vector<uint8_t>(bytes));
    for (size_t i = 0; i < from.size(); ++i)
      batch.push_back(ctx.recv(from[i], 0, in[i].data(), bytes));
    ctx.run(batch);
  });
}

// The memfd pair segments this process holds (each pair's creator keeps one descriptor).
int pairSegments() {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find("shoal-pair") != std::string::npos) ++n;
  }
  return n;
}

TEST(LazyConnect, RingNeighboursOnly) {
  const int n = 6;
  auto store = std::make_shared<store::MemoryStore>();
  const int before = pairSegments();
  std::atomic<int> during{-1};
  auto errors = test::runThreadRanks(
      n, test::testOptions(TransportKind::kAuto, 60),
      [&](comm::Group& g) {
        EXPECT_EQ(comm::nativeEngine(g).endpoint().connectedPeers(), 0)
            << "creation connected something";
        EXPECT_TRUE(comm::nativeEngine(g).allLinksShm());
        const int right = (g.rank() + 1) % n, left = (g.rank() + n - 1) % n;
        const uint64_t mine = 1000 + g.rank();
        std::vector<std::vector<uint8_t>> got;
        exchange(g, {right, left}, &mine, {left, right}, got, sizeof(mine));
        uint64_t a, b;
        std::memcpy(&a, got[0].data(), 8);
        std::memcpy(&b, got[1].data(), 8);
        EXPECT_EQ(a, 1000u + left);
        EXPECT_EQ(b, 1000u + right);
        storeBarrier(*store, "ring", n);
        EXPECT_EQ(comm::nativeEngine(g).endpoint().connectedPeers(), 2) << "rank " << g.rank();
        EXPECT_TRUE(comm::nativeEngine(g).endpoint().connected(left) &&
                    comm::nativeEngine(g).endpoint().connected(right));
        if (g.rank() == 0) during = pairSegments();
        storeBarrier(*store, "ring-counted", n);
      },
      store);
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  // 6 pairs in the ring, each with one segment (held by its accepting end), not 15.
  EXPECT_EQ(during - before, n);
}

TEST(LazyConnect, GridOfSubGroupsConnectsOnlyPairsThatTalk) {
  // 2 x 2 x 2: rank = dp * 4 + pp * 2 + tp. Tensor- and pipeline-parallel pairs talk; the
  // data-parallel groups and the world never do.
  auto errors =
      test::runThreadRanks(8, test::testOptions(TransportKind::kAuto, 60), [](comm::Group& w) {
        const int r = w.rank(), dp = r / 4, pp = (r / 2) % 2, tp = r % 2;
        auto tpGroup = w.split(dp * 2 + pp, r);
        auto ppGroup = w.split(dp * 2 + tp, r);
        auto dpGroup = w.split(pp * 2 + tp, r);
        ASSERT_EQ(tpGroup->size(), 2);
        ASSERT_EQ(ppGroup->size(), 2);
        ASSERT_EQ(dpGroup->size(), 2);
        const uint32_t mine = static_cast<uint32_t>(r);
        for (auto* g : {tpGroup.get(), ppGroup.get()}) {
          std::vector<std::vector<uint8_t>> got;
          const int other = 1 - g->rank();
          exchange(*g, {other}, &mine, {other}, got, sizeof(mine));
          uint32_t v;
          std::memcpy(&v, got[0].data(), 4);
          EXPECT_EQ(v, static_cast<uint32_t>(g == tpGroup.get() ? r ^ 1 : r ^ 2));
          EXPECT_EQ(comm::nativeEngine(*g).endpoint().connectedPeers(), 1);
        }
        EXPECT_EQ(comm::nativeEngine(*dpGroup).endpoint().connectedPeers(), 0);
        EXPECT_EQ(comm::nativeEngine(w).endpoint().connectedPeers(), 0);
      });
  for (int r = 0; r < 8; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

struct Flavor {
  const char* name;
  TransportKind transport;
  EncryptMode encrypt;
  transport::LinkKind kind;
};

class SimultaneousFirstUse : public ::testing::TestWithParam<Flavor> {};

TEST_P(SimultaneousFirstUse, BothEndsSend64MiBAtOnceOverManyGenerations) {
  const Flavor f = GetParam();
  const size_t bytes = 64u << 20;
  const int generations = 6;
  auto store = std::make_shared<store::MemoryStore>();
  std::atomic<uint64_t> collisions{0};
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        std::vector<uint8_t> out(bytes);
        for (int gen = 0; gen < generations; ++gen) {
          auto o = test::testOptions(f.transport, 60);
          o.encrypt = f.encrypt;
          o.generation = 100 + gen;
          auto g = comm::Group::create(store, rank, 2, o);
          SHOAL_CHECK(comm::nativeEngine(*g).linkKind(1 - rank) == f.kind, "planned kind {}",
                      toString(comm::nativeEngine(*g).linkKind(1 - rank)));
          std::memset(out.data(), 'a' + rank + 2 * gen, bytes);
          std::vector<std::vector<uint8_t>> got;
          storeBarrier(*store, fmt::format("gen{}", gen), 2);  // both dial within microseconds
          exchange(*g, {1 - rank}, out.data(), {1 - rank}, got, bytes);
          SHOAL_CHECK(
              got[0].front() == 'a' + (1 - rank) + 2 * gen && got[0].back() == got[0].front(),
              "generation {}: wrong payload", gen);
          SHOAL_CHECK(comm::nativeEngine(*g).endpoint().connectedPeers() == 1, "generation {}",
                      gen);
          collisions += comm::nativeEngine(*g).endpoint().mesh().collisions();
        }
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  std::cerr << f.name << ": " << collisions << " collisions in " << generations << " generations\n";
}

INSTANTIATE_TEST_SUITE_P(Links, SimultaneousFirstUse,
                         ::testing::Values(Flavor{"shm", TransportKind::kAuto, EncryptMode::kAuto,
                                                  transport::LinkKind::kShm},
                                           Flavor{"tcp", TransportKind::kTcp, EncryptMode::kAuto,
                                                  transport::LinkKind::kTcp},
                                           Flavor{"tls", TransportKind::kTcp, EncryptMode::kOn,
                                                  transport::LinkKind::kTls}),
                         [](const auto& info) { return std::string(info.param.name); });

// The point-to-point API (channels on pair groups of their own) first used both ways at once.
TEST(LazyConnect, IsendBothWaysAsFirstOperation) {
  const size_t count = 16u << 20;  // 64 MiB of float
  auto errors =
      test::runThreadRanks(2, test::testOptions(TransportKind::kAuto, 60), [&](comm::Group& g) {
        std::vector<float> out(count, static_cast<float>(g.rank() + 1)), in(count, 0.0f);
        auto s = comm::isend(g, out.data(), count, DataType::kFloat32, 1 - g.rank());
        auto r = comm::irecv(g, in.data(), count, DataType::kFloat32, 1 - g.rank());
        s->wait();
        r->wait();
        EXPECT_EQ(in.front(), static_cast<float>(2 - g.rank()));
        EXPECT_EQ(in.back(), static_cast<float>(2 - g.rank()));
      });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(LazyConnect, FirstUseFromAReceive) {
  auto errors =
      test::runThreadRanks(2, test::testOptions(TransportKind::kAuto, 60), [](comm::Group& g) {
        uint64_t v = 42;
        std::vector<std::vector<uint8_t>> got;
        if (g.rank() == 0) {
          exchange(g, {}, nullptr, {1}, got, sizeof(v));  // dials rank 1 from the receive
          std::memcpy(&v, got[0].data(), 8);
          EXPECT_EQ(v, 42u);
        } else {
          // The link arrives through this rank's acceptor while this thread only waits.
          EXPECT_TRUE(comm::nativeEngine(g).endpoint().mesh().waitConnected(0, Deadline(30s)));
          exchange(g, {0}, &v, {}, got, sizeof(v));
          EXPECT_EQ(comm::nativeEngine(g).endpoint().mesh().dials(), 0u)
              << "rank 1 dialed although rank 0 had";
        }
      });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// A dial for a group the peer has not registered yet waits (parked) until it does.
TEST(LazyConnect, DialIsParkedUntilThePeerRegisters) {
  transport::AcceptorOptions ao;
  ao.secret = "park-secret";
  auto a0 = std::make_shared<transport::Acceptor>(ao);
  auto a1 = std::make_shared<transport::Acceptor>(ao);
  auto plan = [&](int rank) {
    transport::LinkPlan p;
    p.rank = rank;
    p.size = 2;
    p.groupId = 0x1234;
    p.secret = ao.secret;
    p.timeout = 30s;
    p.peers = {{a0->address(), "host", ::getpid(), -1}, {a1->address(), "host", ::getpid(), -1}};
    p.self = p.peers[rank];
    transport::planLinks(p, TransportKind::kTcp);
    return p;
  };
  auto e0 = std::make_unique<transport::Endpoint>(std::make_shared<transport::Mesh>(plan(0)), a0,
                                                  transport::EndpointOptions{});
  transport::FrameHeader h;
  h.bytes = 8;
  uint64_t out = 7, in = 0;
  std::string sendError = "not run";
  std::thread sender([&] {
    try {
      Transfer t = Transfer::send(1, h, &out);
      e0->run(&t, 1, Deadline(30s));
      sendError.clear();
    } catch (const std::exception& e) {
      sendError = e.what();
    }
  });
  ASSERT_TRUE(a1->waitParked(1, Deadline(30s))) << "the dial was not parked";
  auto e1 = std::make_unique<transport::Endpoint>(std::make_shared<transport::Mesh>(plan(1)), a1,
                                                  transport::EndpointOptions{});
  Transfer t = Transfer::recv(0, h, &in);
  e1->run(&t, 1, Deadline(30s));
  sender.join();
  EXPECT_EQ(sendError, "");
  EXPECT_EQ(in, 7u);
}

// Rank 1 aborts the group before it ever talked to rank 0; rank 0 then waits on a receive
// from it: it must fail at once (not at its 60 s deadline), naming rank 1 as the cause.
TEST(LazyConnect, PeerThatAbortedBeforeConnectingIsNamedAtOnce) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<double> took(3, 0);
  auto errors = test::runThreadRanks(
      3, test::testOptions(TransportKind::kAuto, 60),
      [&](comm::Group& g) {
        if (g.rank() == 1) {
          g.interrupt();  // its next operation fails, and that aborts the group
          uint64_t v = 0;
          std::vector<std::vector<uint8_t>> got;
          try {
            exchange(g, {2}, &v, {}, got, sizeof(v));
          } catch (const Error&) {
          }
          store->set("aborted", "1");
          return;
        }
        if (g.rank() == 2) return;
        store->wait({"aborted"}, 60s);
        const auto t0 = Clock::now();
        uint64_t v = 0;
        std::vector<std::vector<uint8_t>> got;
        try {
          exchange(g, {}, &v, {1}, got, sizeof(v));
        } catch (...) {
          took[0] = std::chrono::duration<double>(Clock::now() - t0).count();
          throw;
        }
      },
      store);
  EXPECT_NE(errors[0].find("cause: rank 1"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
  EXPECT_LT(took[0], 10.0) << "rank 0 waited " << took[0] << " s";
}

TEST(LazyConnect, PeerThatNeverJoinsIsNamedAtCreation) {
  auto store = std::make_shared<store::MemoryStore>();
  try {
    comm::Group::create(store, 0, 2, test::testOptions(TransportKind::kAuto, 1));
    FAIL() << "created a group without rank 1";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 did not join the group"), std::string::npos)
        << e.what();
  }
}

TEST(LazyConnect, PeerThatDestroyedTheGroupLeftIt) {
  auto store = std::make_shared<store::MemoryStore>();
  double took = 0;
  auto errors = test::runThreadRanks(
      2, test::testOptions(TransportKind::kAuto, 60),
      [&](comm::Group& w) {
        auto sub = w.split(0, w.rank());
        if (w.rank() == 1) {
          sub.reset();  // destroyed normally, never having talked to rank 0
          store->set("gone", "1");
          store->wait({"told"}, 60s);  // the world (and its acceptor) stays meanwhile
          return;
        }
        store->wait({"gone"}, 60s);
        const auto t0 = Clock::now();
        uint64_t v = 0;
        std::vector<std::vector<uint8_t>> got;
        try {
          exchange(*sub, {}, &v, {1}, got, sizeof(v));
        } catch (...) {
          took = std::chrono::duration<double>(Clock::now() - t0).count();
          store->set("told", "1");
          throw;
        }
      },
      store);
  EXPECT_NE(errors[0].find("left the group"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
  EXPECT_LT(took, 10.0);
}

}  // namespace
}  // namespace shoal
