// Point-to-point over both transports with ranks as threads: large messages both ways at once,
// a ring of large sends, tags completed out of order, batches, mismatches and deadlines.
#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <thread>

#include "comm/collectives.h"
#include "common/error.h"
#include "store/memory_store.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;
using comm::P2pOp;

class P2p : public ::testing::TestWithParam<TransportKind> {};

std::vector<float> pattern(size_t n, int rank, int salt = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + rank * 131 + salt) % 1000);
  return v;
}

void expectAll(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// 64 MiB each way at the same time: both ranks post their send first. Before the channels, each
// rank's send waited for the other to receive, which it could not do while sending: a deadlock
// until the timeout.
TEST_P(P2p, LargeMessagesBothWaysAtOnceNeverDeadlock) {
  const size_t n = (64u << 20) / sizeof(float);
  auto errors = runThreadRanks(2, testOptions(GetParam(), 60), [&](comm::Group& g) {
    const int peer = 1 - g.rank();
    auto out = pattern(n, g.rank());
    std::vector<float> in(n);
    auto s = comm::isend(g, out.data(), n, DataType::kFloat32, peer);
    auto r = comm::irecv(g, in.data(), n, DataType::kFloat32, peer);
    s->wait();
    r->wait();
    EXPECT_EQ(in, pattern(n, peer));
  });
  expectAll(errors);
}

// Every rank sends 16 MiB to the next with a blocking send before receiving from the previous.
TEST_P(P2p, RingOfLargeBlockingSendsCompletes) {
  const int ranks = 4;
  const size_t n = (16u << 20) / sizeof(float);
  auto errors = runThreadRanks(ranks, testOptions(GetParam(), 60), [&](comm::Group& g) {
    const int next = (g.rank() + 1) % ranks, prev = (g.rank() + ranks - 1) % ranks;
    auto out = pattern(n, g.rank());
    std::vector<float> in(n);
    auto r = comm::irecv(g, in.data(), n, DataType::kFloat32, prev);
    comm::send(g, out.data(), n, DataType::kFloat32, next);
    r->wait();
    EXPECT_EQ(in, pattern(n, prev));
  });
  expectAll(errors);
}

// Rank 0 sends tag 1 then tag 2; rank 1 waits for tag 2 before it even posts tag 1.
TEST_P(P2p, TagsAreIndependentAndMatchedInOrderPerTag) {
  const size_t n = 1 << 20;
  auto errors = runThreadRanks(2, testOptions(GetParam(), 30), [&](comm::Group& g) {
    if (g.rank() == 0) {
      auto a1 = pattern(n, 0, 1), a2 = pattern(n, 0, 2), b1 = pattern(n, 0, 3);
      auto w1 = comm::isend(g, a1.data(), n, DataType::kFloat32, 1, /*tag=*/1);
      auto w2 = comm::isend(g, a2.data(), n, DataType::kFloat32, 1, /*tag=*/2);
      auto w3 = comm::isend(g, b1.data(), n, DataType::kFloat32, 1, /*tag=*/1);
      w1->wait();
      w2->wait();
      w3->wait();
    } else {
      std::vector<float> x(n), y(n), z(n);
      comm::irecv(g, x.data(), n, DataType::kFloat32, 0, /*tag=*/2)->wait();
      EXPECT_EQ(x, pattern(n, 0, 2));
      comm::irecv(g, y.data(), n, DataType::kFloat32, 0, /*tag=*/1)->wait();
      comm::irecv(g, z.data(), n, DataType::kFloat32, 0, /*tag=*/1)->wait();
      EXPECT_EQ(y, pattern(n, 0, 1));  // the first tag-1 send is the first tag-1 receive
      EXPECT_EQ(z, pattern(n, 0, 3));
    }
  });
  expectAll(errors);
}

// What a pipeline stage posts at a step: a send forward and a receive from behind, to two peers,
// completed together; point-to-point does not wait behind a collective in flight.
TEST_P(P2p, BatchToSeveralPeersCompletesTogether) {
  const int ranks = 3;
  const size_t n = 300000;
  auto errors = runThreadRanks(ranks, testOptions(GetParam(), 30), [&](comm::Group& g) {
    const int next = (g.rank() + 1) % ranks, prev = (g.rank() + ranks - 1) % ranks;
    auto fwd = pattern(n, g.rank(), 5), bwd = pattern(n, g.rank(), 9);
    std::vector<float> fromPrev(n), fromNext(n);
    auto w = comm::batchIsendIrecv(
        g, {P2pOp{P2pOp::Kind::kSend, fwd.data(), n, DataType::kFloat32, next, 0},
            P2pOp{P2pOp::Kind::kRecv, fromPrev.data(), n, DataType::kFloat32, prev, 0},
            P2pOp{P2pOp::Kind::kSend, bwd.data(), n, DataType::kFloat32, prev, 1},
            P2pOp{P2pOp::Kind::kRecv, fromNext.data(), n, DataType::kFloat32, next, 1}});
    float x = 1;
    comm::allreduce(g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(x, ranks);
    w->wait();
    EXPECT_TRUE(w->test());
    EXPECT_EQ(fromPrev, pattern(n, prev, 5));
    EXPECT_EQ(fromNext, pattern(n, next, 9));
  });
  expectAll(errors);
}

// One small exchange, so that the tag-0 channel is connected and idle: blocking calls after it
// take the direct path (Note [Direct path] in comm/native/p2p_channel.cpp).
void warmUp(comm::Group& g) {
  int32_t v = g.rank();
  if (g.rank() == 0) {
    comm::send(g, &v, 1, DataType::kInt32, 1);
    comm::recv(g, &v, 1, DataType::kInt32, 1);
  } else {
    comm::recv(g, &v, 1, DataType::kInt32, 0);
    comm::send(g, &v, 1, DataType::kInt32, 0);
  }
}

// Rank 0 sends 100 floats, rank 1 receives 77; `warm` first makes the channel connected and
// idle, so that the blocking calls take the direct path. A send completes once handed to the
// transport, so the receiver finds the mismatch; the sender learns it from its next operation
// on that channel (the receiver aborted it).
void expectCountMismatchNamingBothSides(TransportKind transport, bool warm) {
  auto errors = runThreadRanks(2, testOptions(transport, 20), [&](comm::Group& g) {
    if (warm) warmUp(g);
    std::vector<float> v(100, 1.0f);
    try {
      if (g.rank() == 0) {
        comm::send(g, v.data(), 100, DataType::kFloat32, 1);
        comm::recv(g, v.data(), 1, DataType::kFloat32, 1);
      } else {
        comm::recv(g, v.data(), 77, DataType::kFloat32, 0);
      }
    } catch (const MismatchError& e) {
      throw std::runtime_error(std::string("MismatchError: ") + e.what());
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("MismatchError"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("100 x float32"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("77 x float32"), std::string::npos) << errors[r];
  }
}

TEST_P(P2p, CountMismatchFailsTheReceiverAndThenTheSenderNamingBothSides) {
  expectCountMismatchNamingBothSides(GetParam(), /*warm=*/false);
}

// The same on the direct path.
TEST_P(P2p, CountMismatchOnAConnectedChannelFailsBothSides) {
  expectCountMismatchNamingBothSides(GetParam(), /*warm=*/true);
}

// Note [Who drives] in comm/native/p2p_channel.cpp: works nobody waits on are completed by the
// channel's worker. Rank 0 posts a send larger than the shared-memory ring and never waits on it;
// rank 1 never waits on its receive either: both learn of completion through onDone only.
TEST_P(P2p, WorkNobodyWaitsOnStillCompletes) {
  const size_t n = (16u << 20) / sizeof(float);
  auto errors = runThreadRanks(2, testOptions(GetParam(), 30), [&](comm::Group& g) {
    std::vector<float> buf = g.rank() == 0 ? pattern(n, 0) : std::vector<float>(n);
    std::promise<std::exception_ptr> done;
    auto w = g.rank() == 0 ? comm::isend(g, buf.data(), n, DataType::kFloat32, 1)
                           : comm::irecv(g, buf.data(), n, DataType::kFloat32, 0);
    w->onDone([&](std::exception_ptr e) { done.set_value(e); });
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "rank " << g.rank();
    EXPECT_EQ(f.get(), nullptr);
    if (g.rank() == 1) {
      EXPECT_EQ(buf, pattern(n, 0));
    }
  });
  expectAll(errors);
}

// Several threads of one rank wait on works of the same channel while small messages go back and
// forth: every thread returns with its own message (whoever drives completes the others' works).
TEST_P(P2p, ManyWaitersOnOneChannelAndAPingPong) {
  const int threads = 4, rounds = 200;
  auto errors = runThreadRanks(2, testOptions(GetParam(), 30), [&](comm::Group& g) {
    const int peer = 1 - g.rank();
    std::vector<int32_t> got(threads, -1);
    if (g.rank() == 1) {
      std::vector<std::shared_ptr<comm::Work>> works;
      for (int t = 0; t < threads; ++t) {
        works.push_back(comm::irecv(g, &got[t], 1, DataType::kInt32, peer, /*tag=*/7));
      }
      std::vector<std::thread> waiters;
      std::vector<std::string> failures(threads);
      for (int t = 0; t < threads; ++t) {
        waiters.emplace_back([&, t] {
          try {
            works[t]->wait();
          } catch (const std::exception& e) {
            failures[t] = e.what();
          }
        });
      }
      for (auto& th : waiters) th.join();
      for (int t = 0; t < threads; ++t) {
        EXPECT_EQ(failures[t], "");
        EXPECT_EQ(got[t], 100 + t);  // matched in post order
      }
    } else {
      for (int32_t t = 0; t < threads; ++t) {
        int32_t v = 100 + t;
        comm::isend(g, &v, 1, DataType::kInt32, peer, /*tag=*/7)->wait();
      }
    }
    // A ping-pong of 8-byte messages: each side's blocking calls drive the channel themselves.
    int64_t ball = 0;
    for (int i = 0; i < rounds; ++i) {
      if ((i % 2) == g.rank()) {
        ++ball;
        comm::send(g, &ball, 1, DataType::kInt64, peer);
      } else {
        comm::recv(g, &ball, 1, DataType::kInt64, peer);
        EXPECT_EQ(ball, i + 1);
      }
    }
  });
  expectAll(errors);
}

// Both ranks make a blocking send of 64 MiB (more than a shared-memory ring or a socket holds)
// on a connected channel, and only then a second thread of each posts the receive on that same
// channel. The blocking sends run on the direct path; had it kept the channel to itself, each
// rank's receive would wait behind its send, which waits for the other rank's receive: a
// deadlock until the timeout. The posted receive takes the send over into the general path.
TEST_P(P2p, BlockingSendHandsTheChannelOverToAReceivePostedMeanwhile) {
  const size_t n = (64u << 20) / sizeof(float);
  auto errors = runThreadRanks(2, testOptions(GetParam(), 20), [&](comm::Group& g) {
    const int peer = 1 - g.rank();
    warmUp(g);
    auto out = pattern(n, g.rank());
    std::vector<float> in(n);
    std::string helperError;
    // Started before the send, it posts while the send (almost always) already runs; either
    // order must complete.
    std::thread helper([&] {
      try {
        comm::irecv(g, in.data(), n, DataType::kFloat32, peer)->wait();
      } catch (const std::exception& e) {
        helperError = e.what();
      }
    });
    std::string sendError;
    try {
      comm::send(g, out.data(), n, DataType::kFloat32, peer);
    } catch (const std::exception& e) {
      sendError = e.what();
    }
    helper.join();
    EXPECT_EQ(sendError, "");
    EXPECT_EQ(helperError, "");
    EXPECT_EQ(in, pattern(n, peer));
  });
  expectAll(errors);
}

// The direct path keeps the channel's failure policy: a blocking receive on a connected channel
// times out naming the silent peer, and that peer, waiting on the same channel, learns of it
// (the pair group aborts) instead of waiting for its own timeout.
TEST_P(P2p, DirectReceiveTimesOutNamingThePeerAndThePeerLearnsOfIt) {
  auto errors = runThreadRanks(2, testOptions(GetParam(), 30), [&](comm::Group& g) {
    warmUp(g);
    std::vector<float> v(10);
    const auto t0 = Clock::now();
    if (g.rank() == 1) {
      try {
        comm::recv(g, v.data(), 10, DataType::kFloat32, 0, {.timeout = 1s});
        ADD_FAILURE() << "the receive completed";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("with rank 0"), std::string::npos) << e.what();
      }
    } else {
      // Waits on rank 1, which waits on rank 0: rank 1's timeout ends this wait too.
      EXPECT_THROW(comm::recv(g, v.data(), 10, DataType::kFloat32, 1), Error);
    }
    EXPECT_LT(Clock::now() - t0, 10s);  // generous; the group's own timeout is 30 s
  });
  expectAll(errors);
}

TEST_P(P2p, ReceiveFromAPeerThatNeverSendsTimesOutNamingIt) {
  auto errors = runThreadRanks(2, testOptions(GetParam(), 30), [&](comm::Group& g) {
    std::vector<float> v(10);
    if (g.rank() == 1) {
      // Rank 0 talks on tag 0 only, so the tag-3 receive can never complete.
      comm::send(g, v.data(), 10, DataType::kFloat32, 0);
      auto t0 = Clock::now();
      auto w = comm::irecv(g, v.data(), 10, DataType::kFloat32, 0, 3, {.timeout = 1s});
      EXPECT_THROW(w->wait(), TimeoutError);
      EXPECT_LT(Clock::now() - t0, 4s);  // a generous upper bound on a 1 s deadline
      try {
        w->wait();
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("tag 3"), std::string::npos) << e.what();
      }
    } else {
      comm::recv(g, v.data(), 10, DataType::kFloat32, 1);
    }
  });
  expectAll(errors);
}

TEST(P2pArguments, BadPeerTagOrBufferFailsLocallyAtOnce) {
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm, 20), [&](comm::Group& g) {
    float v = 0;
    EXPECT_THROW(comm::isend(g, &v, 1, DataType::kFloat32, g.rank()), InvalidArgument);
    EXPECT_THROW(comm::isend(g, &v, 1, DataType::kFloat32, 5), InvalidArgument);
    EXPECT_THROW(comm::irecv(g, &v, 1, DataType::kFloat32, 1 - g.rank(), -1), InvalidArgument);
    EXPECT_THROW(comm::irecv(g, nullptr, 1, DataType::kFloat32, 1 - g.rank()), InvalidArgument);
  });
  expectAll(errors);
}

// A job destroys and re-creates its world (and a sub-group of it) on the same store, as elastic
// training will: each world is a new generation, so no key, record or frame of an older one is
// read by a newer one. Before generations the second world read the first one's stale keys.
TEST(Generations, AWorldCanBeDestroyedAndRecreatedOnTheSameStore) {
  auto store = std::make_shared<store::MemoryStore>();
  for (int round = 0; round < 3; ++round) {
    auto errors = runThreadRanks(
        3, testOptions(TransportKind::kAuto, 30),
        [&](comm::Group& g) {
          EXPECT_EQ(g.generation(), static_cast<uint64_t>(round));
          float x = static_cast<float>(g.rank() + round);
          comm::allreduce(g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
          EXPECT_EQ(x, 3.0f + 3 * round);
          auto sub = g.split(g.rank() % 2, 0);
          float y = 1;
          comm::allreduce(*sub, &y, 1, DataType::kFloat32, ReduceOp::kSum);
          EXPECT_EQ(y, static_cast<float>(sub->size()));
          EXPECT_EQ(sub->generation(), static_cast<uint64_t>(round));
          std::vector<float> v(1000, static_cast<float>(round)), w(1000);
          if (g.rank() < 2) {
            auto s = comm::isend(g, v.data(), v.size(), DataType::kFloat32, 1 - g.rank());
            comm::irecv(g, w.data(), w.size(), DataType::kFloat32, 1 - g.rank())->wait();
            s->wait();
            EXPECT_EQ(w, v);
          }
        },
        store);
    expectAll(errors);
  }
}

INSTANTIATE_TEST_SUITE_P(, P2p, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(toString(info.param)); });

}  // namespace
}  // namespace shoal::test
