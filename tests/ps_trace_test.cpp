// Parameter servers on the timeline (ps/trace_spans.h): a traced `shoal run --servers` job whose
// merged trace holds each worker's push, pull and push-pull calls and each server's updates,
// with their arguments, in an order the aligned clocks can vouch for.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/process_util.h"
#include "tests/ps_job_util.h"

namespace shoal::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct PsSpan {
  std::string name;
  int rank = 0;
  double begin = 0, end = -1;  // us, on rank 0's clock
  json args;
};

// The "ps" spans of a merged trace: complete events as they are, asynchronous ones paired.
std::vector<PsSpan> psSpans(const json& doc) {
  std::vector<PsSpan> out;
  std::map<std::pair<int, uint64_t>, size_t> open;  // (rank, id) -> index in out
  for (const json& e : doc.at("traceEvents")) {
    if (e.value("cat", "") != "ps") continue;
    const int rank = e.at("pid").get<int>();
    const std::string ph = e.at("ph").get<std::string>();
    if (ph == "X") {
      const double ts = e.at("ts").get<double>();
      out.push_back({e.at("name"), rank, ts, ts + e.at("dur").get<double>(), e.at("args")});
    } else if (ph == "b") {
      open[{rank, e.at("id").get<uint64_t>()}] = out.size();
      out.push_back({e.at("name"), rank, e.at("ts").get<double>(), -1, e.at("args")});
    } else if (ph == "e") {
      const auto it = open.find({rank, e.at("id").get<uint64_t>()});
      EXPECT_NE(it, open.end()) << "an end without a begin: " << e.dump();
      if (it != open.end()) out[it->second].end = e.at("ts").get<double>();
    }
  }
  return out;
}

TEST(PsTimeline, PushesPullsAndAppliesAreSpansOnTheirRanks) {
  constexpr int kWorkers = 2, kServers = 2, kSteps = 4;
  TempDir dir;
  const std::string out = dir.path + "/job.json";
  // Synchronous, whole push-pulls on even steps and key-by-key pushes then a pull on odd ones
  // (tests/ps_worker.cpp's reference scenario).
  const auto r =
      psJob({"-n", std::to_string(kWorkers), "--servers", std::to_string(kServers), "--trace", out},
            {"reference", "--mode", "sync", "--steps", std::to_string(kSteps)}, dir, 240s);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(workersSaying(r.output, kWorkers, "reference exact"), kWorkers) << r.output;
  ASSERT_NE(r.output.find("timeline of 4 ranks in " + out), std::string::npos) << r.output;
  const json doc = json::parse(readFile(out));
  const double errorUs = doc.at("otherData").at("alignment_error_us").get<double>();
  const auto spans = psSpans(doc);

  // Workers are ranks 0 and 1, servers 2 and 3 (the last ranks serve).
  std::map<int, std::map<std::string, int>> count;  // rank -> name -> spans
  std::map<int, std::set<int64_t>> pushedSteps;     // worker rank -> steps pushed
  for (const PsSpan& s : spans) {
    ++count[s.rank][s.name];
    EXPECT_GE(s.end, s.begin) << s.name << " on rank " << s.rank << ": " << s.args.dump();
    EXPECT_FALSE(s.args.contains("error")) << s.args.dump();
    const bool worker = s.rank < kWorkers;
    EXPECT_EQ(worker, s.name != "apply") << s.name << " on rank " << s.rank;
    if (!worker) continue;
    EXPECT_EQ(s.args.at("worker"), s.rank) << s.args.dump();
    if (s.name == "push" || s.name == "push-pull") {
      EXPECT_GT(s.args.at("bytes").get<int64_t>(), 0) << s.args.dump();
      pushedSteps[s.rank].insert(s.args.at("step").get<int64_t>());
    }
    if (s.name == "pull" || s.name == "push-pull") {
      EXPECT_GT(s.args.at("pulled_bytes").get<int64_t>(), 0) << s.args.dump();
      EXPECT_EQ(s.args.at("lead"), 0) << "synchronous: " << s.args.dump();
      EXPECT_TRUE(s.args.contains("version")) << s.args.dump();
    }
    // One-key calls name their key; whole-model calls do not.
    EXPECT_EQ(s.args.contains("key"), s.name == "push") << s.args.dump();
  }
  for (int w = 0; w < kWorkers; ++w) {
    // Even steps (0, 2) push-pull; odd ones (1, 3) push the 3 keys one by one, then pull; a
    // pull at the start and at the end.
    EXPECT_EQ(count[w]["push-pull"], kSteps / 2) << "worker " << w;
    EXPECT_EQ(count[w]["push"], 3 * kSteps / 2) << "worker " << w;
    EXPECT_EQ(count[w]["pull"], kSteps / 2 + 2) << "worker " << w;
    EXPECT_EQ(pushedSteps[w], (std::set<int64_t>{0, 1, 2, 3})) << "worker " << w;
  }

  // Each server applies every step (each key's piece on a key-by-key step), each update the
  // average of both workers' gradients, and its version counts the steps.
  for (int server = kWorkers; server < kWorkers + kServers; ++server) {
    EXPECT_GE(count[server]["apply"], kSteps) << "server rank " << server;
    std::set<int64_t> steps;
    for (const PsSpan& s : spans) {
      if (s.rank != server) continue;
      const int64_t step = s.args.at("step").get<int64_t>();
      steps.insert(step);
      EXPECT_EQ(s.args.at("contributions"), kWorkers) << s.args.dump();
      EXPECT_GT(s.args.at("elements").get<int64_t>(), 0) << s.args.dump();
      EXPECT_EQ(s.args.at("version"), step + 1) << s.args.dump();
      const std::string from = s.args.at("from");
      EXPECT_TRUE(from == "arrival" || from == "slots") << from;
      // Causality across ranks, on the aligned clocks: an update of step t starts after the
      // pushing worker began that step's push.
      bool pushedBefore = false;
      for (const PsSpan& p : spans) {
        if (p.rank == s.args.at("worker").get<int>() &&
            (p.name == "push" || p.name == "push-pull") && p.args.at("step") == step &&
            p.begin <= s.begin + 2 * errorUs + 0.002) {
          pushedBefore = true;
        }
      }
      EXPECT_TRUE(pushedBefore) << "an update before its push: " << s.args.dump();
    }
    EXPECT_EQ(steps, (std::set<int64_t>{0, 1, 2, 3})) << "server rank " << server;
  }
}

}  // namespace
}  // namespace shoal::test
