// `shoal tensorboard` (tools/tensorboard_export.h) and its parts: CRC-32C against published
// vectors, the TFRecord framing and Event bytes, then a 2-rank run's store exported and read
// back by an independent decoder (tests/tensorboard_decode.py: its own CRC-32C and protobuf
// parser) that checks every record's CRCs, the file_version record, tags, steps, values and
// wall times; re-export, bad run directories, and `shoal tensorboard` as a real process.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/trace_file.h"
#include "run/run_directory.h"
#include "tests/process_util.h"
#include "tools/tensorboard_export.h"
#include "tools/tensorboard_writer.h"
#include "track/metrics_store.h"

namespace shoal::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kBaseNs = 1'700'000'000'123'456'789;

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

TEST(Crc32c, PublishedVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720 B.4
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(""), 0u);
  const uint32_t first = crc32c("12345");
  EXPECT_EQ(crc32cExtend(first, "6789", 4), 0xE3069283u);
}

TEST(TensorBoardWriter, RecordFramingAndEventBytes) {
  // Value{tag "a", simple_value 2.0f} in Summary in Event{wall_time 1.5, step 3}.
  const std::string event = tools::scalarEvent(1.5, 3, "a", 2.0f);
  EXPECT_EQ(event, bytes({0x09, 0,    0,    0,    0,    0,   0,    0xF8, 0x3F, 0x10, 0x03, 0x2A,
                          0x0A, 0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0,    0,    0,    0x40}));
  // A negative step is a 10-byte varint (int64, not sint64).
  const std::string negative = tools::scalarEvent(0, -1, "a", 0);
  EXPECT_EQ(negative.substr(9, 11),
            bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  const std::string version = tools::fileVersionEvent(2.0);
  EXPECT_EQ(version.substr(11),
            "\x1a\x0d"
            "brain.Event:2");

  const std::string record = tools::tfRecord(event);
  ASSERT_EQ(record.size(), event.size() + 16);
  EXPECT_EQ(record.substr(0, 8), bytes({static_cast<int>(event.size()), 0, 0, 0, 0, 0, 0, 0}));
  const uint32_t crc = crc32c(record.substr(0, 8));
  const uint32_t mask = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(record.substr(8, 4),
            bytes({static_cast<int>(mask & 0xFF), static_cast<int>(mask >> 8 & 0xFF),
                   static_cast<int>(mask >> 16 & 0xFF), static_cast<int>(mask >> 24)}));
  EXPECT_EQ(record.substr(12, event.size()), event);
  EXPECT_EQ(tools::maskedCrc32c(record.substr(0, 8)), mask);

  EXPECT_EQ(tools::utf8Tag("loss/é€😀"), "loss/é€😀");
  EXPECT_EQ(tools::utf8Tag("a\xff"
                           "b\xc0\xaf"
                           "c\xed\xa0\x80"
                           "\xe2\x82"),
            "a?b??c?????");
  EXPECT_EQ(tools::eventFileName(1700000000, "node/1"), "events.out.tfevents.1700000000.node_1");
  EXPECT_EQ(tools::eventFileName(5, "h"), "events.out.tfevents.0000000005.h");
}

run::RunRecord record(const std::string& name) {
  run::RunRecord r;
  r.name = name;
  r.command = {"train"};
  r.workingDirectory = "/work";
  r.ranks = 2;
  r.startedNs = kBaseNs;
  r.status = "succeeded";
  r.exitCode = 0;
  r.attempts = 1;
  return r;
}

struct Expected {
  std::string tag;
  int64_t step;
  double value;
  int64_t wallNs;
};

// A run of 2 ranks. Rank 0 logs loss with a NaN, an infinity and a value beyond float32 (all
// skipped), steps out of order across commits (written sorted), a step logged twice (both kept,
// by wall time), a negative step, and a name that is not UTF-8; rank 1 logs loss and lr.
// Returns the points each rank's file must hold, in file order.
std::map<int, std::vector<Expected>> makeRun(const std::string& dir) {
  fs::create_directories(dir);
  run::writeRunRecord(dir, record(fs::path(dir).filename().string()));
  track::MetricsStore store(run::metricsPath(dir));
  int64_t seq = 0;
  auto at = [](int64_t ms) { return kBaseNs + ms * 1'000'000; };
  const std::string badName = "bad\xff";
  std::vector<track::MetricPoint> later{{"loss", 5, 0.5, at(50), seq++},
                                        {"loss", 6, kNaN, at(60), seq++},
                                        {"loss", 7, kInf, at(70), seq++},
                                        {"loss", 8, 1e39, at(80), seq++},
                                        {"acc", 5, 0.75, at(51), seq++}};
  store.append(0, later);
  std::vector<track::MetricPoint> earlier{{"loss", 2, 2.25, at(20), seq++},
                                          {"loss", 2, 2.0, at(21), seq++},
                                          {"loss", -1, 3.0, at(10), seq++},
                                          {badName, 3, -1e-3, at(30), seq++}};
  store.append(0, earlier);
  seq = 0;
  std::vector<track::MetricPoint> r1;
  for (int step = 0; step < 4; ++step) {
    r1.push_back({"loss", step, 1.0 / (step + 1), at(100 + step), seq++});
    r1.push_back({"lr", step, 0.1 * step, at(100 + step), seq++});
  }
  store.append(1, r1);
  return {{0,
           {{"loss", -1, 3.0, at(10)},
            {"loss", 2, 2.25, at(20)},
            {"loss", 2, 2.0, at(21)},
            {"bad?", 3, -1e-3, at(30)},
            {"loss", 5, 0.5, at(50)},
            {"acc", 5, 0.75, at(51)}}},
          {1,
           {{"loss", 0, 1.0, at(100)},
            {"lr", 0, 0.0, at(100)},
            {"loss", 1, 0.5, at(101)},
            {"lr", 1, 0.1, at(101)},
            {"loss", 2, 1.0 / 3, at(102)},
            {"lr", 2, 0.2, at(102)},
            {"loss", 3, 0.25, at(103)},
            {"lr", 3, 0.1 * 3, at(103)}}}};
}

// The independent decoder's reading of `logdir`; fails the test if it refuses the files.
json decode(const std::string& logdir) {
  const ShellRun r = runShell(fmt::format("python3 {} {}", SHOAL_TB_DECODER, logdir));
  EXPECT_EQ(r.code, 0) << r.output;
  if (r.code != 0) return json::object();
  return json::parse(r.output);
}

void expectDecoded(const json& runs, const std::map<int, std::vector<Expected>>& expected) {
  ASSERT_EQ(runs.size(), expected.size()) << runs.dump();
  for (const auto& [rank, points] : expected) {
    const std::string run = fmt::format("rank{}", rank);
    ASSERT_TRUE(runs.contains(run)) << runs.dump();
    const json& f = runs[run];
    EXPECT_EQ(f["version"], "brain.Event:2");
    // Named and versioned by the rank's earliest point (the negative step's, for rank 0).
    int64_t earliest = points.front().wallNs;
    for (const Expected& p : points) earliest = std::min(earliest, p.wallNs);
    EXPECT_EQ(f["version_wall_time"].get<double>(), earliest / 1e9);
    EXPECT_EQ(f["file"], tools::eventFileName(earliest / 1'000'000'000, localHostName()));
    const json& scalars = f["scalars"];
    ASSERT_EQ(scalars.size(), points.size()) << f.dump();
    for (size_t i = 0; i < points.size(); ++i) {
      SCOPED_TRACE(fmt::format("rank {} point {}", rank, i));
      EXPECT_EQ(scalars[i][0].get<std::string>(), points[i].tag);
      EXPECT_EQ(scalars[i][1].get<int64_t>(), points[i].step);
      EXPECT_EQ(static_cast<float>(scalars[i][2].get<double>()),
                static_cast<float>(points[i].value));
      EXPECT_EQ(scalars[i][3].get<double>(), points[i].wallNs / 1e9);
    }
  }
}

std::set<std::string> filesUnder(const std::string& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    out.insert(fs::relative(e.path(), root).string());
  }
  return out;
}

TEST(TensorBoardExport, TwoRanksReadBackByAnIndependentDecoder) {
  TempDir tmp;
  const std::string dir = tmp.path + "/run";
  const auto expected = makeRun(dir);
  const std::set<std::string> before = filesUnder(tmp.path);

  const tools::TensorBoardExport r = tools::exportTensorBoard(dir);
  EXPECT_EQ(r.outDir, dir + "/tensorboard");
  EXPECT_EQ(r.points, 14u);
  EXPECT_EQ(r.skipped, 3u);
  ASSERT_EQ(r.files.size(), 2u);
  EXPECT_EQ(r.files[0].rank, 0);
  EXPECT_EQ(r.files[0].points, 6u);
  EXPECT_EQ(r.files[0].skipped, 3u);
  EXPECT_EQ(r.files[0].tags, 3u);  // loss, acc, bad?
  EXPECT_EQ(r.files[1].points, 8u);
  EXPECT_EQ(r.files[1].tags, 2u);
  EXPECT_EQ(fs::path(r.files[1].path).parent_path(), fs::path(dir + "/tensorboard/rank1"));
  expectDecoded(decode(r.outDir), expected);

  // Nothing new outside OUT but SQLite's own files beside the store.
  for (const std::string& f : filesUnder(tmp.path)) {
    if (before.count(f) || f.rfind("run/tensorboard", 0) == 0) continue;
    EXPECT_TRUE(f == "run/metrics.db-wal" || f == "run/metrics.db-shm") << f;
  }

  // Again, after an export from another host left its file: one file per rank, same points;
  // what else is in OUT stays.
  const std::string stale = dir + "/tensorboard/rank0/events.out.tfevents.0000000001.elsewhere";
  { std::ofstream(stale) << "old"; }
  { std::ofstream(dir + "/tensorboard/notes.txt") << "mine"; }
  const tools::TensorBoardExport again = tools::exportTensorBoard(dir);
  EXPECT_EQ(again.files[0].path, r.files[0].path);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(dir + "/tensorboard/notes.txt"));
  expectDecoded(decode(r.outDir), expected);
}

TEST(TensorBoardExport, TheDecoderRefusesACorruptRecord) {
  // The decoder is only a check if it can fail: flip one byte of a record's data.
  TempDir tmp;
  const std::string dir = tmp.path + "/run";
  makeRun(dir);
  const tools::TensorBoardExport r = tools::exportTensorBoard(dir, tmp.path + "/out");
  const std::string path = r.files[1].path;
  std::string data = readFile(path);
  ASSERT_GT(data.size(), 100u);
  data[data.size() - 10] ^= 0x01;
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << data; }
  const ShellRun bad = runShell(fmt::format("python3 {} {}", SHOAL_TB_DECODER, tmp.path + "/out"));
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("bad data CRC"), std::string::npos) << bad.output;
}

TEST(TensorBoardExport, BadRunDirectoriesAreOneLineNamingTheFile) {
  TempDir tmp;
  auto expectInvalid = [&](const std::string& dir, const std::string& file) {
    try {
      tools::exportTensorBoard(dir);
      ADD_FAILURE() << "no error for " << dir;
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  expectInvalid(tmp.path + "/missing", tmp.path + "/missing/run.json");
  EXPECT_FALSE(fs::exists(tmp.path + "/missing"));
  // A folder that is not a run directory.
  fs::create_directories(tmp.path + "/foreign");
  { std::ofstream(tmp.path + "/foreign/data.csv") << "1,2\n"; }
  expectInvalid(tmp.path + "/foreign", tmp.path + "/foreign/run.json");
  EXPECT_FALSE(fs::exists(tmp.path + "/foreign/tensorboard"));
  // A run that logged no metrics: no store is made.
  const std::string bare = tmp.path + "/bare";
  fs::create_directories(bare);
  run::writeRunRecord(bare, record("bare"));
  expectInvalid(bare, run::metricsPath(bare));
  EXPECT_FALSE(fs::exists(run::metricsPath(bare)));
  EXPECT_FALSE(fs::exists(bare + "/tensorboard"));
  // A metrics.db that is not a metrics store.
  const std::string junk = tmp.path + "/junk";
  fs::create_directories(junk);
  run::writeRunRecord(junk, record("junk"));
  { std::ofstream(run::metricsPath(junk)) << "not sqlite at all, just text\n"; }
  expectInvalid(junk, run::metricsPath(junk));
}

TEST(TensorBoardCommand, PrintsWhatItWroteAndExitsTwoOnBadInput) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cli";
  const auto expected = makeRun(dir);
  const ShellRun ok = runShell(fmt::format("{} tensorboard {}", SHOAL_BIN, dir));
  ASSERT_EQ(ok.code, 0) << ok.output;
  const std::string out = dir + "/tensorboard";
  const std::string host = localHostName();
  EXPECT_EQ(
      ok.output,
      fmt::format("shoal tensorboard: {} -> {} (2 ranks, 14 points, 3 skipped as not "
                  "finite)\n"
                  "  rank 0: {}/rank0/{} (6 points, 3 tags)\n"
                  "  rank 1: {}/rank1/{} (8 points, 2 tags)\n"
                  "view with: tensorboard --logdir {}\n",
                  dir, out, out, tools::eventFileName((kBaseNs + 10'000'000) / 1'000'000'000, host),
                  out, tools::eventFileName((kBaseNs + 100'000'000) / 1'000'000'000, host), out));
  expectDecoded(decode(out), expected);

  const ShellRun elsewhere =
      runShell(fmt::format("{} tensorboard {} --out {}/tb", SHOAL_BIN, dir, tmp.path));
  EXPECT_EQ(elsewhere.code, 0) << elsewhere.output;
  expectDecoded(decode(tmp.path + "/tb"), expected);

  for (const std::string& args : {fmt::format("{}/nothing", tmp.path), tmp.path}) {
    const ShellRun bad = runShell(fmt::format("{} tensorboard {}", SHOAL_BIN, args));
    EXPECT_EQ(bad.code, 2) << bad.output;
    EXPECT_EQ(bad.output.rfind("shoal tensorboard: error: ", 0), 0u) << bad.output;
    EXPECT_NE(bad.output.find("run.json"), std::string::npos) << bad.output;
    EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;
  }
  const ShellRun none = runShell(fmt::format("{} tensorboard", SHOAL_BIN));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_EQ(std::count(none.output.begin(), none.output.end(), '\n'), 1) << none.output;
}

}  // namespace
}  // namespace shoal::test
