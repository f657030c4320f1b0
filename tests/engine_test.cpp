// Group's contract held against an engine that is neither the native one nor MPI: the seam of
// comm/engine.h is what a third engine implements, and the policy (issue order, sequence
// numbers, deadlines, one failure ends the group) lives in Group alone.
#include "comm/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "comm/collectives.h"
#include "comm/group.h"
#include "common/error.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

// Records what it is handed; fails where told to.
class RecordingEngine final : public comm::Engine {
 public:
  struct Ran {
    transport::OpCode op;
    uint64_t seq;
    size_t count;
    double timeoutSeconds;
    comm::AllreduceAlgorithm algorithm;
  };

  std::string_view name() const override { return "recording"; }
  int rank() const override { return 1; }
  int size() const override { return 4; }

  void run(const comm::Operation& op, uint64_t seq, const Deadline& deadline) override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ran.push_back({op.op, seq, op.count, deadline.timeoutSeconds(), op.algorithm});
    }
    if (op.count == kFailTimeout) throw TimeoutError("nobody answered");
    if (op.count == kFailArgument) throw InvalidArgument("the library refused the count");
    if (op.count == kFailOther) throw std::runtime_error("a parse error");
  }

  std::exception_ptr abort(std::exception_ptr error, bool& fatal) noexcept override {
    ++aborts;
    try {
      std::rethrow_exception(error);
    } catch (const InvalidArgument&) {
      fatal = false;
      return error;
    } catch (const TimeoutError& e) {
      TimeoutError named(std::string("named by the engine: ") + e.what());
      named.setOrigin(3);
      return std::make_exception_ptr(named);
    } catch (...) {
      return error;
    }
  }

  std::shared_ptr<comm::Engine> split(int color, int key, const Deadline&) override {
    ++splits;
    return color < 0 ? nullptr : std::make_shared<RecordingEngine>();
  }

  std::shared_ptr<comm::Work> post(const comm::Operation&, Duration) override { return nullptr; }
  bool supportsTags() const override { return false; }

  static constexpr size_t kFailTimeout = 1001, kFailArgument = 1002, kFailOther = 1003;
  std::mutex mutex;
  std::vector<Ran> ran;
  std::atomic<int> aborts{0};
  std::atomic<int> splits{0};
};

comm::GroupOptions options() {
  comm::GroupOptions o;
  o.timeout = 7s;
  return o;
}

TEST(EngineSeam, GroupNumbersOperationsInIssueOrderAndHandsThemOverAsDescriptions) {
  auto engine = std::make_shared<RecordingEngine>();
  auto g = comm::Group::create(engine, options());
  EXPECT_EQ(g->rank(), 1);
  EXPECT_EQ(g->size(), 4);
  EXPECT_EQ(g->engineName(), "recording");
  std::vector<float> a(3), b(12);
  comm::allreduce(*g, a.data(), a.size(), DataType::kFloat32, ReduceOp::kAvg,
                  {.timeout = 2s, .algorithm = comm::AllreduceAlgorithm::kRing});
  auto w1 = comm::broadcastAsync(*g, a.data(), a.size(), DataType::kFloat32, 0);
  auto w2 = comm::allgatherAsync(*g, a.data(), b.data(), a.size(), DataType::kFloat32);
  comm::barrier(*g);
  // Point-to-point on an engine without channels of its own runs in issue order, unnumbered.
  comm::send(*g, a.data(), a.size(), DataType::kFloat32, 2);
  w1->wait(10s);
  w2->wait(10s);
  ASSERT_EQ(engine->ran.size(), 5u);
  const transport::OpCode expected[] = {comm::op::kAllreduce, comm::op::kBroadcast,
                                        comm::op::kAllgather, comm::op::kBarrier,
                                        comm::op::kSendRecv};
  const uint64_t seqs[] = {0, 1, 2, 3, 0};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(engine->ran[i].op, expected[i]) << i;
    EXPECT_EQ(engine->ran[i].seq, seqs[i]) << i;
  }
  EXPECT_EQ(engine->ran[0].algorithm, comm::AllreduceAlgorithm::kRing);
  EXPECT_NEAR(engine->ran[0].timeoutSeconds, 2.0, 1e-9);  // the call's deadline
  EXPECT_NEAR(engine->ran[1].timeoutSeconds, 7.0, 1e-9);  // else the group's
  EXPECT_EQ(engine->aborts.load(), 0);
}

TEST(EngineSeam, OneFailureEndsTheGroupWithTheEnginesAccountAndLaterCallsAreRefused) {
  auto engine = std::make_shared<RecordingEngine>();
  auto g = comm::Group::create(engine, options());
  std::vector<float> a(RecordingEngine::kFailTimeout);
  try {
    comm::allreduce(*g, a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
    FAIL() << "the timeout did not reach the caller";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("named by the engine"), std::string::npos) << e.what();
    EXPECT_EQ(e.origin(), 3);
  }
  EXPECT_EQ(engine->aborts.load(), 1);
  const size_t ranBefore = engine->ran.size();
  // Refused at once, synchronously or through a Work, with the cause; the engine is not called.
  try {
    comm::barrier(*g);
    FAIL() << "a failed group ran another operation";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("named by the engine"), std::string::npos) << e.what();
    EXPECT_EQ(e.origin(), 3);
  }
  auto w = comm::barrierAsync(*g);
  EXPECT_THROW(w->wait(10s), PeerError);
  EXPECT_EQ(engine->ran.size(), ranBefore);
  EXPECT_EQ(engine->aborts.load(), 1);
}

TEST(EngineSeam, AnyErrorTypeFailsTheGroupButARefusalBeforeAnythingMovedDoesNot) {
  auto engine = std::make_shared<RecordingEngine>();
  auto g = comm::Group::create(engine, options());
  std::vector<float> refused(RecordingEngine::kFailArgument), other(RecordingEngine::kFailOther);
  EXPECT_THROW(comm::broadcast(*g, refused.data(), refused.size(), DataType::kFloat32, 0),
               InvalidArgument);
  // Still usable: the engine said nothing moved.
  float x = 0;
  comm::allreduce(*g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
  // A plain std::exception from inside an operation reaches the caller as it was, and fails
  // the group all the same.
  EXPECT_THROW(comm::broadcast(*g, other.data(), other.size(), DataType::kFloat32, 0),
               std::runtime_error);
  EXPECT_THROW(comm::allreduce(*g, &x, 1, DataType::kFloat32, ReduceOp::kSum), PeerError);
  EXPECT_EQ(engine->aborts.load(), 2);
}

TEST(EngineSeam, SplitRunsInIssueOrderAndUnsupportedTagsAreRefusedBeforeAnythingIsPosted) {
  auto engine = std::make_shared<RecordingEngine>();
  auto g = comm::Group::create(engine, options());
  float x = 0, y = 0;
  comm::allreduce(*g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
  auto sub = g->split(0, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->engineName(), "recording");
  EXPECT_EQ(g->split(-1, 0), nullptr);
  EXPECT_EQ(engine->splits.load(), 2);
  comm::allreduce(*g, &x, 1, DataType::kFloat32, ReduceOp::kSum);
  // The splits took sequence numbers 1 and 2: they are operations in the group's order.
  EXPECT_EQ(engine->ran.back().seq, 3u);
  // A batch with a tag the engine cannot do fails as a whole, before its first op is posted.
  const size_t before = engine->ran.size();
  std::vector<comm::P2pOp> batch = {
      {comm::P2pOp::Kind::kSend, &x, 1, DataType::kFloat32, 2, 0},
      {comm::P2pOp::Kind::kRecv, &y, 1, DataType::kFloat32, 2, 5},
  };
  EXPECT_THROW(comm::batchIsendIrecv(*g, batch), InvalidArgument);
  EXPECT_EQ(engine->ran.size(), before);
  EXPECT_THROW(g->connect("named", 0, 2), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
