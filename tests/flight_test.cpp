// The flight recorder (common/flight_recorder.h) and who-was-where (run/flight_report.h): the
// ring and its file, the refusal of files that are not a recorder's, the diagnosis of recorders
// written here for each kind of disagreement, and whole jobs under `shoal run` where one rank
// skips a collective or is killed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/env.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "run/flight_report.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

std::string rankFile(const TempDir& dir, int rank) {
  return dir.path + "/" + flightFileName(rank);
}

// Notes `count` completed all-reduces of `bytes` in group "world" (seq from `firstSeq`).
void allreduces(FlightRecorder& r, uint64_t firstSeq, int count, uint64_t bytes = 64) {
  for (int i = 0; i < count; ++i) {
    r.end(r.begin({.group = "world", .op = "allreduce", .seq = firstSeq + i, .bytes = bytes}));
  }
}

TEST(FlightRecorder, KeepsTheNewestEntriesInItsFile) {
  TempDir dir;
  {
    FlightRecorder r(rankFile(dir, 3), 4, 3, "hostA");
    allreduces(r, 0, 5);
    const uint64_t running = r.begin({.group = "world", .op = "barrier", .seq = 5});
    const uint64_t failed = r.begin({.group = "world/split0.1", .op = "broadcast", .seq = 0});
    r.end(failed, "TimeoutError: rank 3: broadcast timed out");
    r.end(1, "an overwritten entry is not touched");
    EXPECT_EQ(running, 6u);
    // Before the recorder is closed, the file already holds everything (a killed process's
    // file reads the same).
    const FlightFile f = readFlightFile(rankFile(dir, 3));
    EXPECT_EQ(f.closedNs, 0);
    ASSERT_EQ(f.entries.size(), 4u);
  }
  const FlightFile f = readFlightFile(rankFile(dir, 3));
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.host, "hostA");
  EXPECT_EQ(f.pid, ::getpid());
  EXPECT_NE(f.closedNs, 0);
  EXPECT_EQ(f.capacity, 4u);
  EXPECT_EQ(f.begun, 7u);
  EXPECT_EQ(f.torn, 0u);
  ASSERT_EQ(f.entries.size(), 4u);
  EXPECT_EQ(f.entries[0].id, 4u);  // 1..3 overwritten
  EXPECT_EQ(f.entries[0].seq, 3u);
  EXPECT_EQ(f.entries[0].state, FlightState::kCompleted);
  EXPECT_GE(f.entries[0].endNs, f.entries[0].startNs);
  EXPECT_EQ(f.entries[2].op, "barrier");
  EXPECT_EQ(f.entries[2].state, FlightState::kRunning);
  EXPECT_EQ(f.entries[2].endNs, 0);
  EXPECT_EQ(f.entries[3].group, "world/split0.1");
  EXPECT_EQ(f.entries[3].state, FlightState::kFailed);
  EXPECT_EQ(f.entries[3].detail, "TimeoutError: rank 3: broadcast timed out");
}

TEST(FlightRecorder, ShortensLongTexts) {
  TempDir dir;
  FlightRecorder r(rankFile(dir, 0), 2, 0, std::string(300, 'h'));
  r.end(r.begin({.group = std::string(200, 'g'), .op = "allreduce"}), std::string(500, 'e'));
  const FlightFile f = readFlightFile(rankFile(dir, 0));
  EXPECT_EQ(f.host.size(), sizeof(FlightHeader::host) - 1);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].group.size(), sizeof(FlightEntry::group) - 1);
  EXPECT_EQ(f.entries[0].detail.size(), sizeof(FlightEntry::detail) - 1);
}

TEST(FlightRecorder, RefusesACapacityOutOfRange) {
  TempDir dir;
  EXPECT_THROW(FlightRecorder(rankFile(dir, 0), 0, 0, "h"), InvalidArgument);
  EXPECT_THROW(FlightRecorder(rankFile(dir, 0), kMaxFlightEvents + 1, 0, "h"), InvalidArgument);
  EXPECT_THROW(FlightRecorder(dir.path + "/missing/flight.rank0", 4, 0, "h"), SystemError);
}

class FlightFileInput : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = rankFile(dir_, 0);
    {
      FlightRecorder r(path_, 4, 0, "h");
      allreduces(r, 0, 2);
    }
    bytes_ = readFile(path_);
    ASSERT_EQ(bytes_.size(), sizeof(FlightHeader) + 4 * sizeof(FlightEntry));
  }
  void write(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  }
  // readFlightFile refuses the file in one line naming it and saying `what`.
  void expectRefused(const std::string& what) {
    try {
      readFlightFile(path_);
      ADD_FAILURE() << "read: " << what;
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path_), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  TempDir dir_;
  std::string path_;
  std::string bytes_;
};

TEST_F(FlightFileInput, RefusesWhatIsNotARecordersFile) {
  write(bytes_.substr(0, 100));
  expectRefused("shorter than its header");
  write(bytes_.substr(0, bytes_.size() - 1));
  expectRefused("truncated");
  write(bytes_ + "x");
  expectRefused("needs");
  std::string other = bytes_;
  other[0] = 'X';
  write(other);
  expectRefused("not a flight recorder file");
  other = bytes_;
  other[8] = 9;  // the version
  write(other);
  expectRefused("version 9");
  other = bytes_;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(other.data() + offsetof(FlightHeader, capacity), &huge, sizeof(huge));
  write(other);
  expectRefused("outside");
  std::filesystem::remove(path_);
  std::filesystem::create_directory(path_);
  expectRefused("not a regular file");
  std::filesystem::remove(path_);
  expectRefused("cannot open");
}

TEST_F(FlightFileInput, SkipsTornSlots) {
  std::string torn = bytes_;
  // The second slot's group text loses its NUL; the first slot claims an id beyond `begun`.
  const size_t second = sizeof(FlightHeader) + sizeof(FlightEntry);
  std::memset(torn.data() + second + offsetof(FlightEntry, group), 'x', sizeof(FlightEntry::group));
  write(torn);
  FlightFile f = readFlightFile(path_);
  EXPECT_EQ(f.torn, 1u);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].id, 1u);
  torn = bytes_;
  const uint64_t beyond = 99;
  std::memcpy(torn.data() + sizeof(FlightHeader), &beyond, sizeof(beyond));
  write(torn);
  f = readFlightFile(path_);
  EXPECT_EQ(f.torn, 1u);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].id, 2u);
}

// Recorders of `ranks` ranks in one folder, written here as ranks of a job would.
class Diagnosis : public ::testing::Test {
 protected:
  FlightRecorder& rank(int r) {
    auto& slot = recorders_[r];
    if (!slot) slot = std::make_unique<FlightRecorder>(rankFile(dir_, r), 64, r, "h");
    return *slot;
  }
  run::FlightDiagnosis diagnose(int expected = 0) {
    return run::diagnoseFlightDir(dir_.path, expected);
  }
  TempDir dir_;
  std::map<int, std::unique_ptr<FlightRecorder>> recorders_;
};

TEST_F(Diagnosis, AgreeingRanksHaveNoDesync) {
  for (int r = 0; r < 3; ++r) allreduces(rank(r), 0, 5);
  recorders_.erase(1);  // rank 1 ended cleanly
  const auto d = diagnose(3);
  EXPECT_EQ(d.desync, "");
  EXPECT_TRUE(d.culprits.empty());
  const std::string text = run::describe(d);
  EXPECT_NE(text.find("no desynchronised operation"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 (host h, pid"), std::string::npos) << text;
  EXPECT_NE(text.find("ended cleanly"), std::string::npos) << text;
  EXPECT_NE(text.find("killed, crashed or still running"), std::string::npos) << text;
  EXPECT_NE(text.find("last: group world (generation 0) seq 4 allreduce (64 bytes), completed"),
            std::string::npos)
      << text;
}

TEST_F(Diagnosis, ARankThatNeverStartedAnOperationIsNamed) {
  for (int r = 0; r < 4; ++r) allreduces(rank(r), 0, r == 2 ? 3 : 4);
  for (int r : {0, 1, 3}) rank(r).begin({.group = "world", .op = "barrier", .seq = 4});
  const auto d = diagnose(5);
  EXPECT_EQ(d.group, "world");
  EXPECT_EQ(d.seq, 3u);
  EXPECT_EQ(d.culprits, std::vector<int>{2});
  EXPECT_EQ(d.missingRanks, std::vector<int>{4});
  EXPECT_EQ(d.desync,
            "group world (generation 0) seq 3 allreduce (64 bytes): ranks 0, 1, 3 started it; "
            "rank 2 never did (rank 2: its last was seq 2 allreduce (64 bytes), completed)");
  EXPECT_NE(run::describe(d).find("no flight recorder file from rank 4"), std::string::npos);
}

TEST_F(Diagnosis, ARankThatSkippedIsSaidToHaveSkipped) {
  // Rank 1 left out the all-reduce of 8 bytes: its seq 1 is the others' seq 2.
  for (int r = 0; r < 3; ++r) {
    auto& rec = rank(r);
    rec.end(rec.begin({.group = "world", .op = "allreduce", .seq = 0, .bytes = 4}));
    uint64_t seq = 1;
    if (r != 1) rec.begin({.group = "world", .op = "allreduce", .seq = seq++, .bytes = 8});
    rec.begin({.group = "world", .op = "allreduce", .seq = seq, .bytes = 12});
  }
  const auto d = diagnose();
  EXPECT_EQ(d.seq, 1u);
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.desync,
            "group world (generation 0) seq 1: rank 1 ran allreduce (12 bytes) where ranks 0, 2 "
            "ran allreduce (8 bytes) (it skipped the others' seq 1: its seq 1 is the others' 2)");
}

TEST_F(Diagnosis, TheEarliestFailureIsNamed) {
  allreduces(rank(0), 0, 1);
  allreduces(rank(1), 0, 1);
  const uint64_t a = rank(1).begin({.group = "world", .op = "broadcast", .seq = 1});
  const uint64_t b = rank(0).begin({.group = "world", .op = "broadcast", .seq = 1});
  rank(1).end(a, "PeerError: rank 1: connection reset");
  rank(0).end(b, "PeerError: rank 0: peer failed (cause: rank 1)");
  const auto d = diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.desync,
            "group world (generation 0) seq 1 broadcast (0 bytes) did not complete on ranks 0, "
            "1: it failed first on rank 1: PeerError: rank 1: connection reset");
}

TEST_F(Diagnosis, GroupsAndGenerationsAreLinedUpApart) {
  // Sub-groups have their own sequence numbers; a generation's world is a group of its own.
  for (int r = 0; r < 2; ++r) {
    allreduces(rank(r), 0, 2);
    rank(r).end(
        rank(r).begin({.group = fmt::format("world/split0.{}", r), .op = "allreduce", .seq = 0}));
    rank(r).end(rank(r).begin({.group = "world", .op = "barrier", .seq = 0, .generation = 1}));
  }
  EXPECT_EQ(diagnose().desync, "");
  // In generation 1, rank 0 goes on alone.
  rank(0).begin({.group = "world", .op = "barrier", .seq = 1, .generation = 1});
  const auto d = diagnose();
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_NE(d.desync.find("group world (generation 1) seq 1 barrier"), std::string::npos)
      << d.desync;
}

TEST_F(Diagnosis, TwoFilesClaimingOneRankAreRefused) {
  allreduces(rank(0), 0, 1);
  std::filesystem::copy_file(rankFile(dir_, 0), dir_.path + "/copy");
  try {
    run::diagnoseFlight({rankFile(dir_, 0), dir_.path + "/copy"});
    ADD_FAILURE() << "diagnosed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("both claim rank 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run::diagnoseFlightDir(dir_.path + "/none"), InvalidArgument);
  TempDir empty;
  EXPECT_THROW(run::diagnoseFlightDir(empty.path), InvalidArgument);
  // Other files in the folder are not recorders' and are left alone.
  EXPECT_EQ(run::flightFiles(dir_.path), std::vector<std::string>{rankFile(dir_, 0)});
}

TEST(FlightEnv, TheVariablesAndFlagsAreChecked) {
  auto env = [](std::map<std::string, std::string> vars) -> EnvReader {
    return [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  EXPECT_FALSE(readEnvConfig(env({})).flightDir);
  const EnvConfig on =
      readEnvConfig(env({{"SHOAL_FLIGHT_DIR", "/tmp/f"}, {"SHOAL_FLIGHT_EVENTS", "8"}}));
  EXPECT_EQ(on.flightDir, "/tmp/f");
  EXPECT_EQ(on.flightEvents, 8u);
  EXPECT_THROW(readEnvConfig(env({{"SHOAL_FLIGHT_DIR", ""}})), InvalidArgument);
  for (const char* bad : {"0", "-1", "many", "1048577"}) {
    try {
      readEnvConfig(env({{"SHOAL_FLIGHT_DIR", "/tmp/f"}, {"SHOAL_FLIGHT_EVENTS", bad}}));
      ADD_FAILURE() << "SHOAL_FLIGHT_EVENTS=" << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_FLIGHT_EVENTS"), std::string::npos) << e.what();
    }
  }
  // The command line: one line, exit code 2.
  for (const std::string& args : {std::string("run -n 2 --flight-events -1 -- true"),
                                  std::string("flight /nonexistent/dir"), std::string("flight")}) {
    const ShellRun r = runShell(fmt::format("{} {}", SHOAL_BIN, args));
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
  }
}

// Whole jobs: `shoal run` with the worker of tests/flight_worker.cpp.
RunResult flightJob(const TempDir& dir, const std::vector<std::string>& worker,
                    std::vector<std::string> options = {}) {
  std::vector<std::string> args{"-n", "4", "--timeout", "20"};
  args.insert(args.end(), options.begin(), options.end());
  args.emplace_back("--");
  args.emplace_back(SHOAL_FLIGHT_WORKER);
  args.insert(args.end(), worker.begin(), worker.end());
  return shoalRun(SHOAL_BIN, args, dir);
}

TEST(FlightJob, ASkippedCollectiveIsNamedFromTheRecorders) {
  TempDir dir;
  const std::string flight = dir.path + "/flight";
  const RunResult r = flightJob(dir, {"skip", "2", "5"}, {"--flight-dir", flight});
  EXPECT_NE(r.code, 0) << r.output;
  // Rank 2's seq 5 is the all-reduce of 1006 floats; the others' is 1005.
  const std::string line =
      "first desynchronised operation: group world (generation 0) seq 5: rank 2 ran allreduce "
      "(4024 bytes) where ranks 0, 1, 3 ran allreduce (4020 bytes)";
  EXPECT_NE(r.output.find("shoal run: flight recorder (" + flight), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  const auto d = run::diagnoseFlightDir(flight, 4);
  EXPECT_EQ(d.group, "world");
  EXPECT_EQ(d.seq, 5u);
  EXPECT_EQ(d.culprits, std::vector<int>{2});
  // `shoal flight DIR` says it again.
  const ShellRun again = runShell(fmt::format("{} flight {} -n 4", SHOAL_BIN, flight));
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find(line), std::string::npos) << again.output;
}

TEST(FlightJob, AKilledRankLeavesItsRecordAndIsNamed) {
  TempDir dir;
  const std::string tmp = dir.path + "/tmp";
  std::filesystem::create_directory(tmp);
  std::vector<std::string> argv{SHOAL_BIN,           "run",  "-n", "3", "--timeout", "20", "--",
                                SHOAL_FLIGHT_WORKER, "kill", "1",  "3"};
  Proc p(argv, dir.path + "/launcher.out", {{"TMPDIR", tmp}});
  const int code = p.wait(std::chrono::seconds(120));
  const std::string out = p.output();
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("seq 3 allreduce (4012 bytes): ranks 0, 2 started it; rank 1 never did "
                     "(rank 1: its last was seq 2 allreduce (4008 bytes), completed)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 1 (host "), std::string::npos) << out;
  // The temporary folder is kept for `shoal flight`; rank 1's file says it never closed.
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) kept.push_back(e.path());
  ASSERT_EQ(kept.size(), 1u);
  const FlightFile f = readFlightFile(kept[0] + "/" + flightFileName(1));
  EXPECT_EQ(f.closedNs, 0);
  ASSERT_FALSE(f.entries.empty());
  EXPECT_EQ(f.entries.back().seq, 2u);
}

TEST(FlightJob, ASuccessfulJobRecordsEveryGroupAndLeavesNoTemporaryFolder) {
  TempDir dir;
  const std::string tmp = dir.path + "/tmp";
  std::filesystem::create_directory(tmp);
  std::vector<std::string> argv{SHOAL_BIN, "run", "-n", "4", "--", SHOAL_FLIGHT_WORKER, "ok"};
  Proc p(argv, dir.path + "/launcher.out", {{"TMPDIR", tmp}});
  EXPECT_EQ(p.wait(std::chrono::seconds(120)), 0) << p.output();
  EXPECT_TRUE(std::filesystem::is_empty(tmp));
  EXPECT_EQ(p.output().find("flight recorder"), std::string::npos) << p.output();

  const std::string flight = dir.path + "/flight";
  const RunResult r = flightJob(dir, {"ok"}, {"--flight-dir", flight});
  EXPECT_EQ(r.code, 0) << r.output;
  const auto d = run::diagnoseFlightDir(flight, 4);
  EXPECT_EQ(d.desync, "");
  ASSERT_EQ(d.files.size(), 4u);
  for (const auto& f : d.files) {
    EXPECT_NE(f.closedNs, 0) << f.rank;
    // 10 all-reduces, the split, the half's all-reduce, the barrier.
    ASSERT_EQ(f.entries.size(), 13u) << f.rank;
    EXPECT_EQ(f.entries[10].op, "internal");
    EXPECT_EQ(f.entries[11].group, fmt::format("world/split0.{}", f.rank % 2));
    EXPECT_EQ(f.entries[11].groupSize, 2);
    EXPECT_EQ(f.entries[12].op, "barrier");
    EXPECT_EQ(f.entries[12].seq, 11u);
    for (const auto& e : f.entries) EXPECT_EQ(e.state, FlightState::kCompleted);
  }
  // No recorders at all.
  const RunResult off =
      flightJob(dir, {"ok"}, {"--flight-events", "0", "--flight-dir", flight + "2"});
  EXPECT_EQ(off.code, 0) << off.output;
  EXPECT_FALSE(std::filesystem::exists(flight + "2"));
}

}  // namespace
}  // namespace shoal::test
