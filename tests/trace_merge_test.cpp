// The merge of rank trace files (run/trace_merge.h): what it writes, and its refusal of what is
// not a rank trace, in one line naming the file.
#include "run/trace_merge.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/trace_file.h"
#include "tests/process_util.h"
#include "tests/trace_util.h"

namespace shoal::test {
namespace {

using nlohmann::json;

class MergeInput : public ::testing::Test {
 protected:
  void SetUp() override {
    TraceSink sink;
    { TraceScope(&sink, "allreduce", "comm").arg("seq", 0); }
    good_ = dir_.path + "/trace.rank0.json";
    writeRankTrace(sink, {.rank = 0, .host = "h", .clockOffsetNs = 5, .clockErrorNs = 3}, good_);
    text_ = readFile(good_);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path + "/" + name;
    writeFileAtomically(path, text);
    return path;
  }
  // The merge of `files` fails with an InvalidArgument of one line naming `culprit`.
  void expectRefused(const std::vector<std::string>& files, const std::string& culprit,
                     const std::string& what, const run::TraceMergeOptions& o = {}) {
    const std::string out = dir_.path + "/job.json";
    try {
      run::mergeTraces(files, out, o);
      ADD_FAILURE() << "merged: " << culprit;
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(culprit), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    EXPECT_FALSE(std::filesystem::exists(out)) << "a failed merge left an output";
  }
  TempDir dir_;
  std::string good_;
  std::string text_;
};

TEST_F(MergeInput, AGoodFileMerges) {
  const auto s = run::mergeTraces({good_}, dir_.path + "/job.json", {.expectedRanks = 2});
  EXPECT_EQ(s.ranks, 1);
  EXPECT_EQ(s.events, 1u);
  EXPECT_EQ(s.alignmentErrorNs, 3);
  EXPECT_EQ(s.missingRanks, std::vector<int>{1});
  EXPECT_EQ(run::describe(s, "job.json"),
            "timeline of 1 rank in job.json: clocks aligned within 0.0 us, 0 spans dropped; no "
            "file from rank(s) 1");
  const Merged m = readMerged(dir_.path + "/job.json");
  EXPECT_EQ(m.doc.at("otherData").at("missing_ranks"), json::array({1}));
}

TEST_F(MergeInput, RanksWithoutAMeasuredOffsetAreNamed) {
  TraceSink sink;
  const std::string other = dir_.path + "/trace.rank1.json";
  writeRankTrace(sink, {.rank = 1, .host = "h2", .clockMeasured = false}, other);
  const auto s = run::mergeTraces({other, good_}, dir_.path + "/job.json");
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.unmeasuredRanks, std::vector<int>{1});
  const Merged m = readMerged(dir_.path + "/job.json");
  EXPECT_EQ(m.doc.at("otherData").at("unmeasured_ranks"), json::array({1}));
  EXPECT_EQ(m.processNames.at(1), "rank 1 (h2)");
}

TEST_F(MergeInput, ATruncatedFileIsRefused) {
  const auto bad = write("trace.rank1.json", text_.substr(0, text_.size() / 2));
  expectRefused({good_, bad}, bad, "malformed JSON");
}

TEST_F(MergeInput, MalformedFilesAreRefused) {
  expectRefused({write("a.json", "")}, "a.json", "malformed JSON");
  expectRefused({write("b.json", "[1,2]")}, "b.json", "not a JSON object");
  expectRefused({write("c.json", R"({"traceEvents":[]})")}, "c.json", "otherData");
  std::string deep = std::string(10000, '[') + std::string(10000, ']');
  expectRefused({write("d.json", deep)}, "d.json", "nested deeper");
  json doc = json::parse(text_);
  doc["otherData"]["rank"] = "zero";
  expectRefused({write("e.json", doc.dump())}, "e.json", "otherData.rank");
  doc = json::parse(text_);
  doc["traceEvents"][0]["pid"] = 7;
  expectRefused({write("f.json", doc.dump())}, "f.json", "does not belong to rank 0");
  doc = json::parse(text_);
  doc["otherData"]["shoal_trace"] = 99;
  expectRefused({write("g.json", doc.dump())}, "g.json", "format version 99");
}

TEST_F(MergeInput, MalformedClockMeasurementsAreRefused) {
  auto withSync = [&](const json& sync) {
    json doc = json::parse(text_);
    doc["otherData"]["clock_sync"] = sync;
    return doc.dump();
  };
  const json one = {{"at_ns", 10}, {"offset_ns", 5}, {"error_ns", 3}};
  expectRefused({write("a.json", withSync(7))}, "a.json", "clock_sync is not an array");
  expectRefused({write("b.json", withSync(json::array({1})))}, "b.json", "clock_sync[0].at_ns");
  json noError = one;
  noError.erase("error_ns");
  expectRefused({write("c.json", withSync(json::array({one, noError})))}, "c.json",
                "clock_sync[1].error_ns");
  json later = one, earlier = one;
  earlier["at_ns"] = 9;
  expectRefused({write("d.json", withSync(json::array({later, earlier})))}, "d.json",
                "measurement 1 was taken before measurement 0");
  json negative = one;
  negative["error_ns"] = -1;
  expectRefused({write("e.json", withSync(json::array({negative})))}, "e.json",
                "negative error bound");
  json fraction = one;
  fraction["offset_ns"] = 0.5;
  expectRefused({write("f.json", withSync(json::array({fraction})))}, "f.json",
                "clock_sync[0].offset_ns");
  expectRefused({write("g.json", withSync(json::array({one})))}, "g.json",
                "1 clock measurements, more than the limit of 0", {.maxClockSamples = 0});
  json huge = json::parse(withSync(json::array({one})));
  huge["traceEvents"][0]["ts"] = 1e306;  // finite, but not once in nanoseconds
  expectRefused({write("h.json", huge.dump())}, "h.json", "out of range once aligned");
}

TEST_F(MergeInput, TwoFilesOfOneRankAreRefused) {
  const auto copy = write("copy.json", text_);
  expectRefused({good_, copy}, copy, "rank 0 also has");
}

TEST_F(MergeInput, SizeAndKindAreCheckedBeforeReading) {
  expectRefused({good_}, good_, "more than the limit", {.maxFileBytes = 10});
  expectRefused({dir_.path}, dir_.path, "not a regular file");
  expectRefused({dir_.path + "/absent.json"}, "absent.json", "cannot be read");
  EXPECT_THROW(run::mergeTraces({}, dir_.path + "/job.json"), InvalidArgument);
}

TEST_F(MergeInput, AFolderWithoutRankFilesIsRefused) {
  TempDir empty;
  EXPECT_THROW(run::mergeTraceDir(empty.path, empty.path + "/job.json"), InvalidArgument);
  write("trace.rank3.json.tmp.1.2", "partial");  // a temporary is not a rank file
  EXPECT_EQ(run::rankTraceFiles(dir_.path), std::vector<std::string>{good_});
}

}  // namespace
}  // namespace shoal::test
