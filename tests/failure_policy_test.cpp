// One failure policy: whatever fails inside an operation aborts the group, the peers learn the
// cause and which rank it started at, and the caller gets the original error; a Work finishes
// exactly once.
#include <gtest/gtest.h>

#include <stdexcept>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

// Before: only Timeout/Peer/Mismatch/Protocol errors aborted the group; a parse error (here a
// std::out_of_range, as std::stoi throws) left the peers waiting for the deadline.
TEST(FailurePolicy, AnyErrorInsideAnOperationAbortsTheGroupAndPeersLearnTheCause) {
  for (auto transport : {TransportKind::kShm, TransportKind::kTcp}) {
    std::vector<std::string> kinds(3);
    auto t0 = Clock::now();
    auto errors = runThreadRanks(3, testOptions(transport, 30), [&](comm::Group& g) {
      transport::FrameHeader base;
      base.dtype = static_cast<uint8_t>(DataType::kFloat32);
      try {
        comm::execute(g, comm::op::kInternal, base, {}, [&](comm::OpContext& ctx) {
          if (ctx.rank() == 1) throw std::out_of_range("stoi: a record that is not a number");
          float x = 0;
          std::vector<transport::Transfer> b{ctx.recv(1, 0, &x, sizeof(x))};
          ctx.run(b);
        });
      } catch (const PeerError& e) {
        kinds[g.rank()] = "PeerError";
        EXPECT_EQ(e.origin(), 1);
        throw;
      } catch (const std::out_of_range& e) {
        kinds[g.rank()] = "out_of_range";
        throw;
      }
    });
    EXPECT_LT(Clock::now() - t0, 10s) << "the peers waited for their deadline";
    EXPECT_EQ(kinds[1], "out_of_range") << "the failing rank gets its own error as it was";
    for (int r : {0, 2}) {
      EXPECT_EQ(kinds[r], "PeerError") << errors[r];
      EXPECT_NE(errors[r].find("(cause: rank 1)"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("a record that is not a number"), std::string::npos) << errors[r];
    }
  }
}

TEST(FailurePolicy, AfterAFailureEveryLaterCallFailsAtOnce) {
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm, 30), [&](comm::Group& g) {
    transport::FrameHeader base;
    try {
      comm::execute(g, comm::op::kInternal, base, {}, [&](comm::OpContext& ctx) {
        if (ctx.rank() == 0) SHOAL_THROW(StoreError, "store said no");
        char c = 0;
        std::vector<transport::Transfer> b{ctx.recv(0, 0, &c, 1)};
        ctx.run(b);
      });
    } catch (const Error&) {
    }
    float x = 1;
    auto t0 = Clock::now();
    EXPECT_THROW(comm::allreduce(g, &x, 1, DataType::kFloat32, ReduceOp::kSum), PeerError);
    EXPECT_LT(Clock::now() - t0, 1s);
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

// Before: a callback that threw made the executor finish the Work a second time, with the
// callback's error, after waiters had already seen success.
TEST(Work, ACallbackThatThrowsDoesNotChangeTheOutcome) {
  auto w = std::make_shared<comm::Work>();
  int calls = 0;
  w->onDone([&](std::exception_ptr) {
    ++calls;
    throw std::runtime_error("callback failed");
  });
  w->finish(nullptr);
  EXPECT_TRUE(w->test());
  EXPECT_NO_THROW(w->wait(1s));
  EXPECT_EQ(w->error(), nullptr);
  EXPECT_EQ(calls, 1);
  // Registered after completion: runs at once, and its throw is contained too.
  w->onDone([&](std::exception_ptr) {
    ++calls;
    throw std::runtime_error("late callback failed");
  });
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(w->finish(nullptr), InternalError);
}

TEST(Work, AllCompletesWhenEveryPartDidWithTheFirstError) {
  auto a = std::make_shared<comm::Work>(), b = std::make_shared<comm::Work>();
  auto all = comm::Work::all({a, b});
  EXPECT_FALSE(all->test());
  b->finish(std::make_exception_ptr(PeerError("b failed")));
  EXPECT_FALSE(all->test());
  a->finish(nullptr);
  EXPECT_TRUE(all->test());
  EXPECT_THROW(all->wait(1s), PeerError);
  EXPECT_TRUE(comm::Work::all({})->test());
}

}  // namespace
}  // namespace shoal::test
