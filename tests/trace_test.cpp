// The timeline's recording side: the trace sink's ring, TraceScope, the SHOAL_TRACE variables,
// and the span every operation of a group records (thread ranks).
#include "common/trace.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/collectives.h"
#include "common/env.h"
#include "common/error.h"
#include "tests/thread_ranks.h"
#include "tests/trace_util.h"

namespace shoal::test {
namespace {

TraceSpan named(const std::string& name) {
  TraceSpan s;
  s.name = name;
  s.category = "test";
  return s;
}

// ---- The sink

TEST(TraceSink, KeepsTheNewestSpansAndCountsTheDropped) {
  TraceSink sink({.capacity = 3});
  for (int i = 0; i < 5; ++i) sink.record(named(fmt::format("s{}", i)));
  uint64_t recorded = 0, dropped = 0;
  const auto spans = sink.snapshot(&recorded, &dropped);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "s2");
  EXPECT_EQ(spans[1].name, "s3");
  EXPECT_EQ(spans[2].name, "s4");
  EXPECT_EQ(recorded, 5u);
  EXPECT_EQ(dropped, 2u);
  EXPECT_EQ(sink.dropped(), 2u);
}

TEST(TraceSink, BeforeWrappingItKeepsEverythingInOrder) {
  TraceSink sink({.capacity = 10});
  for (int i = 0; i < 4; ++i) sink.record(named(fmt::format("s{}", i)));
  const auto spans = sink.snapshot();
  ASSERT_EQ(spans.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(spans[i].name, fmt::format("s{}", i));
  EXPECT_EQ(sink.dropped(), 0u);
}

TEST(TraceSink, ACapacityOutOfRangeIsRefused) {
  EXPECT_THROW(TraceSink({.capacity = 0}), InvalidArgument);
  EXPECT_THROW(TraceSink({.capacity = kMaxTraceEvents + 1}), InvalidArgument);
}

TEST(TraceSink, ThreadsRecordingAtOnceLoseNothingButWhatTheRingDrops) {
  TraceSink sink({.capacity = 500});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) TraceScope(&sink, "work", "test").arg("i", i);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sink.recorded(), 4000u);
  EXPECT_EQ(sink.dropped(), 3500u);
  const auto spans = sink.snapshot();
  EXPECT_EQ(spans.size(), 500u);
  std::set<uint64_t> tids;
  for (const auto& s : spans) tids.insert(s.thread);
  EXPECT_GE(tids.size(), 1u);
  for (const auto& s : spans) EXPECT_LE(s.beginNs, s.endNs);
}

TEST(TraceScope, ANullSinkRecordsNothingAndCostsNothing) {
  TraceScope scope(static_cast<TraceSink*>(nullptr), "nothing", "test");
  EXPECT_FALSE(scope.active());
  scope.arg("n", 1).arg("text", "x").arg("d", 0.5);  // no effect, no crash
  std::shared_ptr<TraceSink> none;
  TraceScope fromShared(none, "nothing", "test");
  EXPECT_FALSE(fromShared.active());
}

TEST(TraceScope, RecordsOneSpanWithItsArgumentsOnThisThread) {
  TraceSink sink;
  {
    TraceScope scope(&sink, "allreduce", "comm");
    scope.arg("seq", uint64_t{7}).arg("algorithm", std::string_view("ring")).arg("ratio", 0.25);
    for (int i = 0; i < 10; ++i) scope.arg("extra", i);  // beyond kMaxTraceArgs: ignored
  }
  const auto spans = sink.snapshot();
  ASSERT_EQ(spans.size(), 1u);
  const TraceSpan& s = spans[0];
  EXPECT_EQ(s.name, "allreduce");
  EXPECT_STREQ(s.category, "comm");
  EXPECT_EQ(s.thread, TraceSink::currentThread());
  EXPECT_LE(s.beginNs, s.endNs);
  EXPECT_EQ(s.argCount, kMaxTraceArgs);
  EXPECT_EQ(s.args[0].intValue, 7);
  EXPECT_EQ(s.text(s.args[1]), "ring");
  EXPECT_EQ(s.args[2].doubleValue, 0.25);
}

TEST(TraceScope, StopEndsTheSpanAndArgumentsAddedLaterAreKept) {
  TraceSink sink({.clockSkewNs = 5'000'000'000});
  int64_t end = 0;
  {
    TraceScope scope(&sink, "op", "test");
    const auto inside = std::chrono::steady_clock::now();
    end = scope.stop();
    EXPECT_GE(sink.at(inside), scope.beginNs());  // at() is the clock now() reads
    EXPECT_LE(sink.at(inside), end);
    EXPECT_EQ(scope.stop(), end);  // once stopped, the end stays
    scope.arg("after", 1);
  }
  const auto spans = sink.snapshot();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].endNs, end);
  ASSERT_EQ(spans[0].argCount, 1u);
  EXPECT_STREQ(spans[0].args[0].key, "after");
  TraceScope none(static_cast<TraceSink*>(nullptr), "nothing", "test");
  EXPECT_EQ(none.stop(), 0);
  EXPECT_EQ(none.beginNs(), 0);
}

TEST(TraceEnv, TheVariablesAreCheckedAndResolved) {
  auto env = [](std::map<std::string, std::string> vars) -> EnvReader {
    return [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  const EnvConfig off = readEnvConfig(env({}));
  EXPECT_FALSE(off.traceDir);
  EXPECT_FALSE(comm::GroupOptions::from(off).trace);
  const EnvConfig on =
      readEnvConfig(env({{"SHOAL_TRACE", "/tmp/t"}, {"SHOAL_TRACE_EVENTS", "64"}}));
  EXPECT_EQ(on.traceDir, "/tmp/t");
  EXPECT_EQ(on.traceEvents, 64u);
  const auto options = comm::GroupOptions::from(on);
  ASSERT_TRUE(options.trace);
  EXPECT_EQ(options.trace->capacity(), 64u);
  EXPECT_THROW(readEnvConfig(env({{"SHOAL_TRACE", ""}})), InvalidArgument);
  for (const char* bad : {"0", "-1", "many", "99999999999"}) {
    try {
      readEnvConfig(env({{"SHOAL_TRACE", "/tmp/t"}, {"SHOAL_TRACE_EVENTS", bad}}));
      ADD_FAILURE() << "SHOAL_TRACE_EVENTS=" << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_TRACE_EVENTS"), std::string::npos) << e.what();
    }
  }
}

// ---- Operation spans

TEST(GroupTrace, EveryOperationIsASpanWithItsSequenceNumberOnEveryRank) {
  constexpr int n = 4;
  std::vector<std::shared_ptr<TraceSink>> sinks;
  for (int r = 0; r < n; ++r) sinks.push_back(std::make_shared<TraceSink>());
  auto errors = runTracedRanks(sinks, [&](comm::Group& g) {
    std::vector<float> v(1000, 1.0f);
    comm::allreduce(g, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum,
                    {.algorithm = comm::AllreduceAlgorithm::kRing});
    comm::broadcast(g, v.data(), 10, DataType::kFloat32, 2);
    comm::allreduceAsync(g, v.data(), 3, DataType::kFloat32, ReduceOp::kMax)->wait();
    comm::barrier(g);
    if (g.rank() < 2) {
      int32_t x = 5;
      if (g.rank() == 0) comm::send(g, &x, 1, DataType::kInt32, 1);
      if (g.rank() == 1) comm::recv(g, &x, 1, DataType::kInt32, 0);
    }
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  for (int r = 0; r < n; ++r) {
    std::vector<TraceSpan> comm;
    std::vector<TraceSpan> p2p;
    for (auto& s : sinks[r]->snapshot()) {
      (std::string_view(s.category) == "comm" ? comm : p2p).push_back(s);
    }
    std::string seen;
    for (const auto& s : comm) seen += s.name + " ";
    ASSERT_EQ(comm.size(), 4u) << "rank " << r << ": " << seen;
    const char* names[] = {"allreduce", "broadcast", "allreduce", "barrier"};
    for (size_t i = 0; i < comm.size(); ++i) {
      EXPECT_EQ(comm[i].name, names[i]);
      std::map<std::string, const TraceArg*> args;
      for (size_t a = 0; a < comm[i].argCount; ++a) args[comm[i].args[a].key] = &comm[i].args[a];
      ASSERT_TRUE(args.count("seq"));
      EXPECT_EQ(args["seq"]->intValue, static_cast<int64_t>(i));
      EXPECT_EQ(args["group_rank"]->intValue, r);
      EXPECT_EQ(args["group_size"]->intValue, n);
      EXPECT_EQ(comm[i].asyncId, 0u);
      EXPECT_LE(comm[i].beginNs, comm[i].endNs);
      if (i == 0) {
        EXPECT_EQ(args["bytes"]->intValue, 4000);
        ASSERT_TRUE(args.count("algorithm"));
        EXPECT_EQ(comm[i].text(*args["algorithm"]), "ring");
      }
      // Every span names its group and the links its messages take; the barrier has no
      // described operation (it runs as a task of its own), so no transport.
      ASSERT_TRUE(args.count("group")) << names[i];
      EXPECT_EQ(comm[i].text(*args["group"]), "world") << names[i];
      if (i != 3) {
        ASSERT_TRUE(args.count("transport")) << names[i];
        // Thread ranks of one host: shared memory.
        EXPECT_EQ(comm[i].text(*args["transport"]), "shm") << names[i];
      }
      // The asynchronous all-reduce says how long it was queued; the others do not.
      EXPECT_EQ(args.count("queued_us"), i == 2 ? 1u : 0u) << names[i];
      // Every rank receives a message of each but the broadcast's root (Note [Operation
      // spans]): its span has no split, the others' two parts make up the span.
      const size_t split = i == 1 && r == 2 ? 0u : 1u;
      EXPECT_EQ(args.count("wait_us"), split) << names[i] << " on rank " << r;
      EXPECT_EQ(args.count("transfer_us"), split) << names[i] << " on rank " << r;
      if (split == 1 && args.count("wait_us") == 1 && args.count("transfer_us") == 1) {
        const double wait = args["wait_us"]->doubleValue;
        const double transfer = args["transfer_us"]->doubleValue;
        EXPECT_GE(wait, 0);
        EXPECT_GE(transfer, 0);
        EXPECT_NEAR(wait + transfer, static_cast<double>(comm[i].endNs - comm[i].beginNs) / 1e3,
                    1e-6);
      }
    }
    if (r < 2) {
      ASSERT_EQ(p2p.size(), 1u) << "rank " << r;
      EXPECT_EQ(p2p[0].name, r == 0 ? "send" : "recv");
      EXPECT_STREQ(p2p[0].category, "p2p");
      EXPECT_NE(p2p[0].asyncId, 0u);
      std::map<std::string, std::string> texts;
      for (size_t a = 0; a < p2p[0].argCount; ++a) {
        texts[p2p[0].args[a].key] = std::string(p2p[0].text(p2p[0].args[a]));
      }
      EXPECT_EQ(texts["transport"], "shm");
      EXPECT_EQ(texts["group"], "world");
      EXPECT_LE(p2p[0].beginNs, p2p[0].endNs);
    } else {
      EXPECT_TRUE(p2p.empty()) << "rank " << r;
    }
  }
}

TEST(GroupTrace, SpansNameTheTransportTheirMessagesTake) {
  constexpr int n = 2;
  std::vector<std::shared_ptr<TraceSink>> sinks;
  for (int r = 0; r < n; ++r) sinks.push_back(std::make_shared<TraceSink>());
  auto errors = runTracedRanks(
      sinks,
      [&](comm::Group& g) {
        std::vector<float> v(64, 1.0f);
        comm::allreduce(g, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      },
      TransportKind::kTcp);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    const auto spans = sinks[r]->snapshot();
    ASSERT_EQ(spans.size(), 1u);
    std::map<std::string, std::string> texts;
    for (size_t a = 0; a < spans[0].argCount; ++a) {
      texts[spans[0].args[a].key] = std::string(spans[0].text(spans[0].args[a]));
    }
    EXPECT_EQ(texts["transport"], "tcp");
    EXPECT_EQ(texts["group"], "world");
  }
}

TEST(TraceSpan, CopiedAndStaticTextsKeepTheirOwnValuesAfterTheSpanMoves) {
  TraceSpan span;
  span.add("a", std::string_view("first"));
  span.add("s", StaticText{"static"});
  span.add("b", std::string_view("a second, longer text than std::string keeps inline"));
  span.add("n", 3);
  const TraceSpan moved = std::move(span);
  ASSERT_EQ(moved.argCount, 4u);
  EXPECT_EQ(moved.text(moved.args[0]), "first");
  EXPECT_EQ(moved.text(moved.args[1]), "static");
  EXPECT_EQ(moved.text(moved.args[2]), "a second, longer text than std::string keeps inline");
  EXPECT_EQ(moved.text(moved.args[3]), "");  // a number has no text
  EXPECT_EQ(moved.args[3].intValue, 3);
}

TEST(TraceSink, ARingOverSeveralChunksKeepsTheNewestInOrder) {
  // 600 slots: three chunks of the ring's storage, the last one partial.
  TraceSink sink({.capacity = 600});
  for (int i = 0; i < 1000; ++i) {
    TraceSpan span;
    span.name = "op";
    span.add("i", i);
    sink.record(std::move(span));
  }
  uint64_t recorded = 0, dropped = 0;
  const auto spans = sink.snapshot(&recorded, &dropped);
  EXPECT_EQ(recorded, 1000u);
  EXPECT_EQ(dropped, 400u);
  ASSERT_EQ(spans.size(), 600u);
  for (size_t k = 0; k < spans.size(); ++k) EXPECT_EQ(spans[k].args[0].intValue, 400 + int(k));
}

TEST(GroupTrace, AGroupOfOneReceivesNothingAndHasNoSplit) {
  std::vector<std::shared_ptr<TraceSink>> sinks{std::make_shared<TraceSink>()};
  auto errors = runTracedRanks(sinks, [&](comm::Group& g) {
    std::vector<float> v(100, 1.0f);
    comm::allreduce(g, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    comm::barrier(g);
  });
  ASSERT_EQ(errors[0], "");
  const auto spans = sinks[0]->snapshot();
  ASSERT_EQ(spans.size(), 2u);
  for (const auto& s : spans) {
    for (size_t a = 0; a < s.argCount; ++a) {
      EXPECT_NE(std::string_view(s.args[a].key), "wait_us") << s.name;
      EXPECT_NE(std::string_view(s.args[a].key), "transfer_us") << s.name;
    }
  }
}

TEST(GroupTrace, AFailedOperationSaysWhy) {
  auto sink = std::make_shared<TraceSink>();
  auto errors = runThreadRanks(
      2,
      [&](int r) {
        auto o = testOptions(TransportKind::kAuto, 2);
        if (r == 0) o.trace = sink;
        return o;
      },
      [&](comm::Group& g) {
        // Rank 1 never joins the barrier: rank 0 times out.
        if (g.rank() == 0) comm::barrier(g, {.timeout = std::chrono::milliseconds(300)});
      });
  EXPECT_NE(errors[0], "");
  const auto spans = sink->snapshot();
  ASSERT_EQ(spans.size(), 1u);
  bool hasError = false;
  for (size_t a = 0; a < spans[0].argCount; ++a) {
    if (std::string_view(spans[0].args[a].key) == "error") {
      hasError = true;
      EXPECT_EQ(spans[0].text(spans[0].args[a]).find('\n'), std::string::npos);
      EXPECT_FALSE(spans[0].text(spans[0].args[a]).empty());
    }
  }
  EXPECT_TRUE(hasError);
}

}  // namespace
}  // namespace shoal::test
