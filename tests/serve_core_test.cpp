// shoal-serve's parts that need neither libtorch nor HTTP: the batching queue, the request JSON
// and the metrics text. Waits are condition variables with deadlines, never sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tools/serve/batch_queue.h"
#include "tools/serve/predict_request.h"
#include "tools/serve/serve_metrics.h"

namespace shoal::serve {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

BatchQueueOptions opts(size_t maxBatch, std::chrono::microseconds window, size_t limit = 1000) {
  BatchQueueOptions o;
  o.maxBatch = maxBatch;
  o.window = window;
  o.limit = limit;
  return o;
}

TEST(BatchQueue, AFullBatchLeavesWithoutWaitingForItsWindow) {
  BatchQueue<int> q(opts(4, 60s));
  for (int i = 0; i < 6; ++i) ASSERT_EQ(q.push(i, 1), PushResult::kAccepted);
  const auto t0 = Clock::now();
  EXPECT_EQ(q.popBatch(Clock::now() + 30s), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_LT(Clock::now() - t0, 10s);
  // Two left, a 60 s window: the caller's deadline comes first.
  EXPECT_TRUE(q.popBatch(Clock::now() + 50ms).empty());
  EXPECT_FALSE(q.closed());
  EXPECT_EQ(q.depth(), 2u);
}

TEST(BatchQueue, RequestsOfSeveralRowsFillBatchesInArrivalOrder) {
  BatchQueue<int> q(opts(4, 60s));
  ASSERT_EQ(q.push(1, 3), PushResult::kAccepted);
  ASSERT_EQ(q.push(2, 3), PushResult::kAccepted);
  // Six rows wait (a batch's worth): the first request leaves alone, the second would overflow.
  EXPECT_EQ(q.popBatch(Clock::now() + 30s), (std::vector<int>{1}));
  ASSERT_EQ(q.push(3, 1), PushResult::kAccepted);
  EXPECT_EQ(q.popBatch(Clock::now() + 30s), (std::vector<int>{2, 3}));
  EXPECT_EQ(q.push(4, 5), PushResult::kTooLarge);
  EXPECT_EQ(q.push(4, 0), PushResult::kTooLarge);
}

TEST(BatchQueue, APartialBatchLeavesWhenItsWindowEnds) {
  BatchQueue<int> q(opts(64, 100ms));
  const auto t0 = Clock::now();
  ASSERT_EQ(q.push(7, 1), PushResult::kAccepted);
  ASSERT_EQ(q.push(8, 1), PushResult::kAccepted);
  EXPECT_EQ(q.popBatch(Clock::now() + 30s), (std::vector<int>{7, 8}));
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 10s);
}

TEST(BatchQueue, AFullQueueRefusesAtOnce) {
  BatchQueue<int> q(opts(1, 0us, /*limit=*/2));
  EXPECT_EQ(q.push(1, 1), PushResult::kAccepted);
  EXPECT_EQ(q.push(2, 1), PushResult::kAccepted);
  EXPECT_EQ(q.push(3, 1), PushResult::kFull);
  EXPECT_EQ(q.depth(), 2u);
  EXPECT_EQ(q.popBatch(Clock::now() + 30s), (std::vector<int>{1}));
  EXPECT_EQ(q.push(3, 1), PushResult::kAccepted);
}

TEST(BatchQueue, CloseWakesWaitersAndHandsOutWhatIsLeft) {
  BatchQueue<int> q(opts(64, 60s));
  std::atomic<int> returned{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      // Empty batches until closed; the one request is handed out without its 60 s window.
      for (;;) {
        auto b = q.popBatch(Clock::now() + 120s);
        if (b.empty()) break;
        EXPECT_EQ(b, std::vector<int>{5});
      }
      ++returned;
    });
  }
  ASSERT_EQ(q.push(5, 1), PushResult::kAccepted);
  const auto t0 = Clock::now();
  q.close();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(returned.load(), 3);
  EXPECT_LT(Clock::now() - t0, 30s);
  EXPECT_TRUE(q.closed());
  EXPECT_EQ(q.depth(), 0u);
  EXPECT_EQ(q.push(6, 1), PushResult::kClosed);
}

TEST(BatchQueue, DeadlineOnAnEmptyQueue) {
  BatchQueue<int> q(opts(4, 0us));
  const auto t0 = Clock::now();
  EXPECT_TRUE(q.popBatch(t0 + 20ms).empty());
  EXPECT_GE(Clock::now() - t0, 20ms);
  EXPECT_FALSE(q.closed());
}

TEST(BatchQueue, ManyProducersAndConsumersLoseNothing) {
  BatchQueue<int> q(opts(8, 200us, /*limit=*/100000));
  constexpr int kProducers = 4, kEach = 2000;
  std::mutex mutex;
  std::vector<int> seen;
  std::atomic<size_t> biggest{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < 3; ++c) {
    consumers.emplace_back([&] {
      for (;;) {
        auto b = q.popBatch(Clock::now() + 60s);
        if (b.empty()) {
          if (q.closed()) return;
          continue;
        }
        size_t prev = biggest.load();
        while (b.size() > prev && !biggest.compare_exchange_weak(prev, b.size())) {
        }
        std::lock_guard<std::mutex> lock(mutex);
        seen.insert(seen.end(), b.begin(), b.end());
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) ASSERT_EQ(q.push(p * kEach + i, 1), PushResult::kAccepted);
    });
  }
  for (auto& t : producers) t.join();
  q.close();
  for (auto& t : consumers) t.join();
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), size_t{kProducers * kEach});
  for (int i = 0; i < kProducers * kEach; ++i) ASSERT_EQ(seen[i], i);
  EXPECT_LE(biggest.load(), 8u);
}

// --- request JSON ----------------------------------------------------------------------------

std::string parseError(const std::string& body, size_t size = 3, size_t max = 4) {
  try {
    parsePredictRequest(body, size, max);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(PredictRequest, ParsesOneInstanceOrABatch) {
  auto one = parsePredictRequest(R"({"inputs": [1, 2.5, -3]})", 3, 4);
  EXPECT_EQ(one.instances, 1u);
  EXPECT_EQ(one.values, (std::vector<float>{1, 2.5f, -3}));
  auto two = parsePredictRequest(R"({"inputs": [[1,2,3],[4,5,6]]})", 3, 4);
  EXPECT_EQ(two.instances, 2u);
  EXPECT_EQ(two.values, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(PredictRequest, RejectsBadInputWithOneLine) {
  EXPECT_NE(parseError("not json").find("not JSON"), std::string::npos);
  EXPECT_NE(parseError("[1,2,3]").find("\"inputs\""), std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": []})").find("non-empty"), std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [1,2]})").find("has 2 values; the model takes 3"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [[1,2,3],[1,2]]})").find("instance 1 has 2 values"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [1,"2",3]})").find("is a string, not a number"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [[1,2,3], 4]})").find("not an array"), std::string::npos);
  // nlohmann's parser refuses a number past double's range outright.
  EXPECT_NE(parseError(R"({"inputs": [1,1e999,3]})"), "");
  EXPECT_NE(parseError(R"({"inputs": [1,1e39,3]})").find("not a finite float32"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [[1,2,3],[1,2,3],[1,2,3],[1,2,3],[1,2,3]]})")
                .find("5 instances in one request; at most 4"),
            std::string::npos);
}

TEST(PredictRequest, ResponseCarriesExactFloatsAndArgmax) {
  const float out[] = {0.1f, 0.7f, -2.0f, 3.25f, 1e-30f, 3.0f};
  const auto j = nlohmann::json::parse(formatPredictResponse(out, 2, 3, 9));
  EXPECT_EQ(j["model_version"], 9);
  EXPECT_EQ(j["classes"], nlohmann::json({1, 0}));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(j["outputs"][i / 3][i % 3].get<float>(), out[i]) << i;
  }
  EXPECT_EQ(errorJson("first\nsecond"), R"({"error":"first"})");
}

TEST(ServeMetrics, RendersPrometheusText) {
  ServeMetrics m;
  m.countStatus("predict", 200);
  m.countStatus("predict", 200);
  m.countStatus("predict", 400);
  m.countStatus("/../x", 404);
  m.observeLatency(0.003);
  m.countBatch(5, 3);
  m.countReload(true);
  m.countReload(false);
  const std::string text = m.render({2, 8, 1, 4});
  for (const char* line :
       {"shoal_serve_requests_total{route=\"predict\",code=\"200\"} 2\n",
        "shoal_serve_requests_total{route=\"predict\",code=\"400\"} 1\n",
        "shoal_serve_requests_total{route=\"other\",code=\"404\"} 1\n",
        "shoal_serve_request_seconds_bucket{le=\"0.002\"} 0\n",
        "shoal_serve_request_seconds_bucket{le=\"0.004\"} 1\n",
        "shoal_serve_request_seconds_count 1\n", "shoal_serve_batch_instances_bucket{le=\"4\"} 0\n",
        "shoal_serve_batch_instances_bucket{le=\"8\"} 1\n", "shoal_serve_batch_instances_sum 5\n",
        "shoal_serve_batch_requests_total 3\n", "shoal_serve_queue_depth 2\n",
        "shoal_serve_queue_limit 8\n", "shoal_serve_batches_in_flight 1\n",
        "shoal_serve_model_version 4\n", "shoal_serve_model_reloads_total 1\n",
        "shoal_serve_model_reload_failures_total 1\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

}  // namespace
}  // namespace shoal::serve
