// `shoal sweep` as users run it: the real binary, trials through `shoal run`, the fake trainer
// (sweep_fake_trainer.cpp) as the program. Parallel trials, a failing trial, the results files,
// resume after the sweep is SIGKILLed, and the command line's errors.
#include <gtest/gtest.h>
#include <sys/file.h>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"

namespace {

using shoal::test::Proc;
using shoal::test::readFile;
using shoal::test::runShell;
using shoal::test::TempDir;
using Json = nlohmann::json;

std::string writeConfig(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/sweep.config.json";
  std::ofstream(path) << text;
  return path;
}

// The journal's events, parsed (a torn last line left out).
std::vector<Json> journal(const std::string& sweepDir) {
  std::vector<Json> events;
  std::istringstream lines(readFile(sweepDir + "/trials.jsonl"));
  std::string line;
  while (std::getline(lines, line)) {
    Json j = Json::parse(line, nullptr, false);
    if (j.is_object()) events.push_back(std::move(j));
  }
  return events;
}

int count(const std::vector<Json>& events, const std::string& kind) {
  return static_cast<int>(std::count_if(events.begin(), events.end(),
                                        [&](const Json& j) { return j["event"] == kind; }));
}

// Blocks until `done(journal)` holds or `timeout` passes, on inotify events of the sweep's
// directory (every append to the journal is one): no sleeping.
bool waitForJournal(const std::string& sweepDir,
                    const std::function<bool(const std::vector<Json>&)>& done,
                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (in < 0 || ::inotify_add_watch(in, sweepDir.c_str(), IN_MODIFY | IN_CREATE) < 0) {
    throw std::runtime_error("inotify on " + sweepDir + ": " + std::strerror(errno));
  }
  bool ok = false;
  while (!(ok = done(journal(sweepDir)))) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{in, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) > 0) {
      char events[4096];
      while (::read(in, events, sizeof(events)) > 0) {
      }
    }
  }
  ::close(in);
  return ok;
}

// Pidfds of the processes (other than this one) whose command line mentions `text`.
std::vector<int> pidfdsMentioning(const std::string& text) {
  std::vector<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::string cmdline = readFile(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(text) == std::string::npos) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) fds.push_back(fd);
  }
  return fds;
}

// True when every process behind `fds` has exited within `timeout` (closes the fds).
bool allExit(const std::vector<int>& fds, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ok = true;
  for (int fd : fds) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    ok = ok && ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) == 1;
    ::close(fd);
  }
  return ok;
}

}  // namespace

TEST(SweepProcess, GridFindsTheBestAndRecordsFailures) {
  TempDir tmp;
  const std::string dir = tmp.path + "/sweep";
  // x in {-1, -0.5, 0, 0.5, 1} x y in {-0.2, 0.5}: the best is x=0.5, y=-0.2; x=1 fails.
  const std::string config = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "3", "--fail-above", "0.9"],
    "metric": "score", "direction": "max", "trials": 100, "parallel": 3,
    "algorithm": "grid", "grace": 1, "trial_time_limit": 60,
    "parameters": {{
      "x": {{"type": "uniform", "low": -1, "high": 1}},
      "y": {{"type": "choice", "values": [-0.2, 0.5]}}
    }}}})",
                                                               SHOAL_SWEEP_TRAINER));
  const auto r = runShell(fmt::format("{} sweep {} --dir {}", SHOAL_BIN, config, dir));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto events = journal(dir);
  EXPECT_EQ(count(events, "start"), 10);  // the grid's 10 points, not the budget's 100
  EXPECT_EQ(count(events, "end"), 10);
  int failed = 0, completed = 0;
  for (const Json& e : events) {
    if (e["event"] != "end") continue;
    if (e["status"] == "failed") {
      ++failed;
      EXPECT_EQ(e["params"]["x"], 1.0);
      EXPECT_EQ(e["exit_code"], 3);
      EXPECT_TRUE(e["metric"].is_null());
    } else {
      ++completed;
      EXPECT_EQ(e["status"], "completed");
      EXPECT_EQ(e["curve"].size(), 3u);
    }
  }
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(completed, 8);
  const Json best = Json::parse(readFile(dir + "/best.json"));
  EXPECT_EQ(best["params"]["x"], 0.5);
  EXPECT_EQ(best["params"]["y"], -0.2);
  EXPECT_NEAR(best["metric"].get<double>(), 1 - 0.04, 1e-9);
  // The command line that reproduces it, through the launcher.
  const auto& cmd = best["command"];
  EXPECT_EQ(cmd[0], "shoal");
  EXPECT_NE(std::find(cmd.begin(), cmd.end(), "0.5"), cmd.end());
  EXPECT_NE(r.output.find("best: trial"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed"), std::string::npos);
  const std::string csv = readFile(dir + "/results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 11) << csv;
  EXPECT_TRUE(std::filesystem::exists(dir + "/plots/metric_by_trial.png"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/plots/metric_vs_x.png"));
  EXPECT_NE(readFile(dir + "/trial-0009/log.txt").find("diverged"), std::string::npos);

  // The same directory again: the sweep is complete, nothing runs twice.
  const auto again = runShell(fmt::format("{} sweep {} --dir {}", SHOAL_BIN, config, dir));
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(count(journal(dir), "start"), 10);
}

TEST(SweepProcess, ResumesAfterSigkill) {
  TempDir tmp;
  const std::string dir = tmp.path + "/sweep";
  const std::string gate = tmp.path + "/gate";
  // Trials 0-2 run at once; trials from 3 on wait for the gate, so the sweep is certainly
  // midway when it is killed.
  const std::string config = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "2", "--trial", "{{trial}}", "--gate", "{}", "--gate-from", "3",
                 "--ready", "{{trial_dir}}/../ready-{{trial}}"],
    "metric": "score", "trials": 7, "parallel": 2, "algorithm": "tpe", "seed": 5, "grace": 1,
    "tpe": {{"startup_trials": 4}},
    "parameters": {{
      "x": {{"type": "uniform", "low": -1, "high": 1}},
      "y": {{"type": "log_uniform", "low": 0.01, "high": 1}}
    }}}})",
                                                               SHOAL_SWEEP_TRAINER, gate));
  std::vector<Json> before;
  std::filesystem::create_directories(dir);  // for waitForJournal's watch; the sweep takes it
  {
    Proc sweep({SHOAL_BIN, "sweep", config, "--dir", dir}, tmp.path + "/first.log");
    ASSERT_TRUE(waitForJournal(
        dir,
        [&](const std::vector<Json>& e) {
          // Three trials done, two waiting at the gate (their ranks created ready-N).
          return count(e, "end") == 3 && count(e, "start") == 5 &&
                 std::filesystem::exists(dir + "/ready-3") &&
                 std::filesystem::exists(dir + "/ready-4");
        },
        std::chrono::seconds(60)))
        << readFile(tmp.path + "/first.log");
    // The running trials (their `shoal run` and its rank) die with the sweep: none is left to
    // write into the directory a resumed sweep uses.
    const std::vector<int> trials = pidfdsMentioning(gate);
    EXPECT_EQ(trials.size(), 4u);  // two launchers, two ranks
    ::kill(sweep.pid(), SIGKILL);
    EXPECT_EQ(sweep.wait(std::chrono::seconds(30)), 128 + SIGKILL);
    EXPECT_TRUE(allExit(trials, std::chrono::seconds(10)));
    before = journal(dir);
  }
  ASSERT_EQ(count(before, "end"), 3);
  std::map<int, Json> startedParams;
  for (const Json& e : before) {
    if (e["event"] == "start") startedParams[e["trial"].get<int>()] = e["params"];
  }
  ASSERT_EQ(startedParams.size(), 5u);

  // Another configuration in the same directory is refused; so is a second sweep while one
  // runs there (the lock, taken here as a running sweep holds it).
  {
    const int held = ::open((dir + "/sweep.lock").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
    const auto busy = runShell(fmt::format("{} sweep --resume {}", SHOAL_BIN, dir));
    EXPECT_EQ(busy.code, 2) << busy.output;
    EXPECT_NE(busy.output.find("another shoal sweep is running there"), std::string::npos)
        << busy.output;
    ::close(held);
  }
  std::string changed = readFile(config);
  changed.replace(changed.find("\"seed\": 5"), 9, "\"seed\": 6");
  std::ofstream(tmp.path + "/changed.json") << changed;
  const auto refused =
      runShell(fmt::format("{} sweep {}/changed.json --dir {}", SHOAL_BIN, tmp.path, dir));
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("holds another sweep"), std::string::npos) << refused.output;

  std::ofstream(gate) << "open\n";
  const auto r = runShell(fmt::format("{} sweep --resume {}", SHOAL_BIN, dir));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 trials finished, 2 to run again"), std::string::npos) << r.output;
  const auto after = journal(dir);
  // The first three trials' ends are kept as they were, nothing ran twice but the interrupted.
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]);
  std::map<int, int> ends;
  for (size_t i = before.size(); i < after.size(); ++i) {
    const Json& e = after[i];
    const int id = e["trial"].get<int>();
    EXPECT_GE(id, 3) << e.dump();
    if (e["event"] == "end") {
      ++ends[id];
      EXPECT_EQ(e["status"], "completed") << e.dump();
    }
    // The interrupted trials run again with the parameters they had.
    if (startedParams.count(id) != 0) EXPECT_EQ(e["params"], startedParams[id]);
  }
  EXPECT_EQ(ends, (std::map<int, int>{{3, 1}, {4, 1}, {5, 1}, {6, 1}}));
  const Json best = Json::parse(readFile(dir + "/best.json"));
  EXPECT_TRUE(best["trial"].is_number());

  // --force: the other configuration takes the directory; the trials that fit its space are
  // kept, so one more trial makes the budget of 8.
  const auto forced = runShell(fmt::format("{} sweep {}/changed.json --dir {} --force --trials 8",
                                           SHOAL_BIN, tmp.path, dir));
  ASSERT_EQ(forced.code, 0) << forced.output;
  EXPECT_EQ(Json::parse(readFile(dir + "/sweep.json"))["seed"], 6);
  EXPECT_EQ(count(journal(dir), "end"), 8);
}

TEST(SweepProcess, CommandLineErrors) {
  TempDir tmp;
  const std::string bad = writeConfig(
      tmp.path,
      R"({"command": ["x"], "metric": "m", "parameters": {"lr": {"type": "log_uniform", "low": 0, "high": 1}}})");
  auto r = runShell(fmt::format("{} sweep {} --dir {}/d", SHOAL_BIN, bad, tmp.path));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("parameters.lr.low: a log range must be above zero"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  r = runShell(fmt::format("{} sweep {}", SHOAL_BIN, bad));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--dir is required"), std::string::npos) << r.output;
  r = runShell(fmt::format("{} sweep --resume --dir {}/nothing", SHOAL_BIN, tmp.path));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("holds no sweep"), std::string::npos) << r.output;
  r = runShell(fmt::format("{} sweep {} --dir {}/d --parallel 0", SHOAL_BIN, bad, tmp.path));
  EXPECT_EQ(r.code, 2);
  // A program that does not exist: every trial fails, the sweep says so and exits 1.
  const std::string missing = writeConfig(
      tmp.path,
      R"({"command": ["/nonexistent/prog"], "metric": "m", "trials": 2, "launcher": "direct",
                    "parameters": {"lr": {"type": "uniform", "low": 0, "high": 1}}})");
  r = runShell(fmt::format("{} sweep {} --dir {}/e", SHOAL_BIN, missing, tmp.path));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("best: none"), std::string::npos) << r.output;
}

TEST(SweepProcess, StopsTrialsByAshaTimeLimitAndSignal) {
  TempDir tmp;
  // In grid order, one at a time: x=0.3 (the best) runs to the end; x=-1 is worse at epoch 1
  // and would hang there: ASHA stops it (SIGTERM, or SIGKILL after the grace when the trial
  // ignores SIGTERM). x=0.2 is a little worse than 0.3 at epoch 1: outside the top half.
  const std::string dir = tmp.path + "/asha";
  const std::string config = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "3", "--hang-below", "0.955", "--ignore-term", "{{ignore}}"],
    "metric": "score", "parallel": 1, "algorithm": "grid", "launcher": "direct",
    "trial_time_limit": 2, "grace": 0.5,
    "early_stopping": {{"type": "asha", "min_epochs": 1, "reduction_factor": 2, "max_epochs": 3}},
    "parameters": {{
      "x": {{"type": "choice", "values": [0.3, -1, 0.2]}},
      "ignore": {{"type": "choice", "values": [0, 1], "flag": ""}}
    }}}})",
                                                               SHOAL_SWEEP_TRAINER));
  // The grid is x-major: (0.3,0) (0.3,1) (-1,0) (-1,1) (0.2,0) (0.2,1); keep the first five.
  const auto start = std::chrono::steady_clock::now();
  const auto r = runShell(fmt::format("{} sweep {} --dir {} --trials 5", SHOAL_BIN, config, dir));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<int, Json> ends;
  for (const Json& e : journal(dir)) {
    if (e["event"] == "end") ends[e["trial"].get<int>()] = e;
  }
  ASSERT_EQ(ends.size(), 5u) << r.output;
  EXPECT_EQ(ends[0]["status"], "completed");
  EXPECT_EQ(ends[1]["status"], "completed");
  for (int t : {2, 3}) {  // x=-1: pruned at the first rung, whether it ignores SIGTERM or not
    EXPECT_EQ(ends[t]["status"], "pruned") << ends[t].dump();
    EXPECT_EQ(ends[t]["curve"].size(), 1u);
    EXPECT_NE(ends[t]["reason"].get<std::string>().find("ASHA"), std::string::npos);
  }
  EXPECT_EQ(ends[3]["exit_code"], 128 + SIGKILL);  // it ignored SIGTERM
  // x=0.2 (final score 0.95, so it hangs after epoch 1) is worse than 0.3's there: pruned.
  EXPECT_EQ(ends[4]["status"], "pruned") << ends[4].dump();
  EXPECT_LT(seconds, 20) << r.output;

  // Trials faster than the sweep's look at their metrics: ASHA reads the rung after the trial
  // has finished all its epochs; such a trial completed, it is not pruned.
  const std::string fastDir = tmp.path + "/fast";
  const std::string fast = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "3"],
    "metric": "score", "parallel": 1, "algorithm": "grid", "launcher": "direct",
    "early_stopping": {{"type": "asha", "min_epochs": 1, "reduction_factor": 2, "max_epochs": 3}},
    "parameters": {{"x": {{"type": "choice", "values": [0.3, -1, -0.5]}}}}}})",
                                                             SHOAL_SWEEP_TRAINER));
  const auto fastRun = runShell(fmt::format("{} sweep {} --dir {}", SHOAL_BIN, fast, fastDir));
  ASSERT_EQ(fastRun.code, 0) << fastRun.output;
  for (const Json& e : journal(fastDir)) {
    if (e["event"] == "end") EXPECT_EQ(e["status"], "completed") << e.dump();
  }

  // A trial that hangs without a rung to stop it: the trial's time limit does.
  const std::string limitDir = tmp.path + "/limit";
  const std::string hanging = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "3", "--hang-below", "2", "--ignore-term", "1"],
    "metric": "score", "trials": 1, "launcher": "direct", "trial_time_limit": 1, "grace": 0.5,
    "parameters": {{"x": {{"type": "uniform", "low": 0, "high": 1}}}}}})",
                                                                SHOAL_SWEEP_TRAINER));
  const auto limited = runShell(fmt::format("{} sweep {} --dir {}", SHOAL_BIN, hanging, limitDir));
  EXPECT_EQ(limited.code, 1) << limited.output;  // no trial completed
  const auto events = journal(limitDir);
  ASSERT_EQ(count(events, "end"), 1);
  EXPECT_EQ(events.back()["status"], "timeout");
  EXPECT_EQ(events.back()["exit_code"], 128 + SIGKILL);
  EXPECT_EQ(events.back()["curve"].size(), 1u);

  // SIGINT: the running trial is stopped and left for --resume; exit 130.
  const std::string intDir = tmp.path + "/int";
  std::filesystem::create_directories(intDir);
  const std::string slow = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "3", "--hang-below", "2"],
    "metric": "score", "trials": 3, "launcher": "direct", "grace": 0.5,
    "parameters": {{"x": {{"type": "uniform", "low": 0, "high": 1}}}}}})",
                                                             SHOAL_SWEEP_TRAINER));
  Proc sweep({SHOAL_BIN, "sweep", slow, "--dir", intDir}, tmp.path + "/int.log");
  ASSERT_TRUE(waitForJournal(
      intDir, [](const std::vector<Json>& e) { return count(e, "start") == 1; },
      std::chrono::seconds(30)));
  ::kill(sweep.pid(), SIGINT);
  EXPECT_EQ(sweep.wait(std::chrono::seconds(30)), 130) << sweep.output();
  EXPECT_NE(sweep.output().find("--resume"), std::string::npos) << sweep.output();
  const auto interrupted = journal(intDir);
  EXPECT_EQ(count(interrupted, "start"), 1);
  EXPECT_EQ(count(interrupted, "end"), 0);
}

TEST(SweepProcess, AHungTrialTimesOutAndTheSweepGoesOn) {
  TempDir tmp;
  const std::string dir = tmp.path + "/sweep";
  // Through the launcher (the default), one trial at a time; trials 1 and 3 hang after their
  // first epoch and ignore SIGTERM. The configuration names no trial limit: --trial-time-limit
  // sets it, and sweep.json keeps it for the resume below.
  const std::string config = writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "2", "--trial", "{{trial}}", "--hang-trials", "1,3",
                "--ignore-term", "1"],
    "metric": "score", "trials": 3, "parallel": 1, "algorithm": "random", "seed": 3, "grace": 0.5,
    "parameters": {{"x": {{"type": "uniform", "low": -1, "high": 1}}}}}})",
                                                               SHOAL_SWEEP_TRAINER));
  const auto start = std::chrono::steady_clock::now();
  Proc first({SHOAL_BIN, "sweep", config, "--dir", dir, "--trial-time-limit", "2"},
             tmp.path + "/first.log");
  ASSERT_EQ(first.wait(std::chrono::seconds(90)), 0) << first.output();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 60) << first.output();
  EXPECT_NE(first.output().find("each stopped after 2 s"), std::string::npos) << first.output();

  auto events = journal(dir);
  std::map<int, Json> ends;
  std::map<int, size_t> startAt, endAt;
  for (size_t i = 0; i < events.size(); ++i) {
    const int id = events[i]["trial"].get<int>();
    if (events[i]["event"] == "end") {
      ends[id] = events[i];
      endAt[id] = i;
    } else {
      startAt[id] = i;
    }
  }
  ASSERT_EQ(ends.size(), 3u) << first.output();
  EXPECT_EQ(ends[0]["status"], "completed") << ends[0].dump();
  EXPECT_EQ(ends[1]["status"], "timeout") << ends[1].dump();
  EXPECT_EQ(ends[1]["reason"], "the trial time limit (2 s)") << ends[1].dump();
  EXPECT_EQ(ends[1]["curve"].size(), 1u);  // it reported epoch 1, then hung
  EXPECT_NE(ends[1]["exit_code"], 0);
  EXPECT_GE(ends[1]["seconds"].get<double>(), 2.0);
  EXPECT_EQ(ends[2]["status"], "completed") << ends[2].dump();
  EXPECT_LT(endAt[1], startAt[2]);  // the sweep went on to the next trial after the timeout
  // The table and results.csv say "timeout", not "failed" or "pruned".
  EXPECT_NE(first.output().find("timeout"), std::string::npos) << first.output();
  EXPECT_EQ(first.output().find("failed"), std::string::npos) << first.output();
  std::string csv = readFile(dir + "/results.csv");
  const std::string row1 = csv.substr(csv.find("\n1,") + 1, csv.find("\n2,") - csv.find("\n1,"));
  EXPECT_NE(row1.find(",timeout,1,"), std::string::npos) << csv;  // status, epochs
  EXPECT_NE(row1.find(",the trial time limit (2 s)\n"), std::string::npos) << csv;
  EXPECT_EQ(Json::parse(readFile(dir + "/sweep.json"))["trial_time_limit"], 2.0);

  // A resume with a larger budget and no flag: the timed-out trial is kept as it was (not run
  // again), and trial 3, which hangs too, is stopped by the same 2 s limit (not the default
  // hour, which would run past this wait).
  Proc resumed({SHOAL_BIN, "sweep", "--resume", dir, "--trials", "4"}, tmp.path + "/second.log");
  ASSERT_EQ(resumed.wait(std::chrono::seconds(90)), 0) << resumed.output();
  EXPECT_NE(resumed.output().find("3 trials finished, 0 to run again"), std::string::npos)
      << resumed.output();
  events = journal(dir);
  int startsOf1 = 0;
  Json end3;
  for (const Json& e : events) {
    if (e["trial"] == 1 && e["event"] == "start") ++startsOf1;
    if (e["trial"] == 3 && e["event"] == "end") end3 = e;
  }
  EXPECT_EQ(startsOf1, 1);
  ASSERT_TRUE(end3.is_object()) << resumed.output();
  EXPECT_EQ(end3["status"], "timeout") << end3.dump();
  EXPECT_EQ(end3["reason"], "the trial time limit (2 s)") << end3.dump();
  csv = readFile(dir + "/results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;
  size_t timeouts = 0;
  for (size_t at = csv.find(",timeout,"); at != std::string::npos;
       at = csv.find(",timeout,", at + 1)) {
    ++timeouts;
  }
  EXPECT_EQ(timeouts, 2u) << csv;

  // --trial-time-limit 0 lifts the limit (kept too); a bad value is one line and exit 2.
  const auto bad =
      runShell(fmt::format("{} sweep --resume {} --trial-time-limit 5x", SHOAL_BIN, dir));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--trial-time-limit"), std::string::npos) << bad.output;
  EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;
  const auto negative =
      runShell(fmt::format("{} sweep --resume {} --trial-time-limit=-1", SHOAL_BIN, dir));
  EXPECT_EQ(negative.code, 2) << negative.output;
  const auto none =
      runShell(fmt::format("{} sweep --resume {} --trial-time-limit 0", SHOAL_BIN, dir));
  EXPECT_EQ(none.code, 0) << none.output;  // the configuration's 3 trials have run: none runs
  EXPECT_NE(none.output.find("no limit per trial"), std::string::npos) << none.output;
  EXPECT_EQ(Json::parse(readFile(dir + "/sweep.json"))["trial_time_limit"], 0.0);
}

namespace {

// "h:1,h:2,g:0" -> {(h,1), (h,2), (g,0)}, in rank order.
std::vector<std::pair<std::string, int>> slotsOf(const std::string& list) {
  std::vector<std::pair<std::string, int>> out;
  std::istringstream in(list);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    const size_t colon = entry.rfind(':');
    out.emplace_back(entry.substr(0, colon), std::stoi(entry.substr(colon + 1)));
  }
  return out;
}

}  // namespace

// Two "hosts" (0x7f.0.0.1 and 0x7f.0.0.2: 127.0.0.1 and 127.0.0.2 spelled so that `shoal run`
// resolves them but does not take them for this machine, so it goes through --ssh), a fake ssh
// that runs the rank here and tells it which host it was given, 2-rank trials, parallel 3 over
// 4 slots: at most 2 trials at once, one of them spanning both hosts.
TEST(SweepProcess, TrialsRunOnTheHostsSlots) {
  TempDir tmp;
  const std::string dir = tmp.path + "/sweep", meet = tmp.path + "/meet";
  const std::string placements = tmp.path + "/placements.txt";
  std::filesystem::create_directories(meet);
  const std::string hostA = "0x7f.0.0.1", hostB = "0x7f.0.0.2";
  // x in {-1, -0.5, 0, 0.5, 1}: 5 trials, the best x=0.5; trials 0 and 1 wait for each other
  // (so two trials provably held slots at once) before their epochs.
  const std::string config =
      writeConfig(tmp.path, fmt::format(R"({{
    "command": ["{}", "--epochs", "2", "--trial", "{{trial}}", "--placements", "{}",
                "--meet", "{}", "--meet-count", "2", "--y", "-0.2"],
    "metric": "score", "direction": "max", "trials": 100, "parallel": 3, "ranks_per_trial": 2,
    "algorithm": "grid", "grace": 1, "trial_time_limit": 120,
    "parameters": {{"x": {{"type": "uniform", "low": -1, "high": 1}}}}}})",
                                        SHOAL_SWEEP_TRAINER, placements, meet));
  const auto r = runShell(fmt::format("{} sweep {} --dir {} --hosts {}:3,{}:1 --ssh 'sh {}'",
                                      SHOAL_BIN, config, dir, hostA, hostB, SHOAL_SWEEP_FAKE_SSH));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("at most 2 trials at once"), std::string::npos) << r.output;

  // The journal: every trial on 2 of the given slots; trials that overlapped in time held
  // disjoint slots.
  struct Trial {
    int id;
    int64_t start, end;
    std::string hosts;
    std::vector<std::pair<std::string, int>> slots;
  };
  std::map<int, Trial> trials;
  for (const Json& e : journal(dir)) {
    if (e["event"] != "end") continue;
    EXPECT_EQ(e["status"], "completed") << e.dump();
    ASSERT_TRUE(e.contains("slots") && e.contains("hosts")) << e.dump();
    Trial t{e["trial"].get<int>(), e["started_ms"].get<int64_t>(), e["ended_ms"].get<int64_t>(),
            e["hosts"].get<std::string>(), slotsOf(e["slots"].get<std::string>())};
    ASSERT_EQ(t.slots.size(), 2u) << e.dump();
    for (const auto& [host, index] : t.slots) {
      EXPECT_TRUE((host == hostA && index >= 0 && index < 3) || (host == hostB && index == 0))
          << e.dump();
    }
    trials[t.id] = t;
  }
  ASSERT_EQ(trials.size(), 5u) << r.output;
  // Both took their slots at the start, first fit: trial 1 spans the hosts.
  EXPECT_EQ(trials[0].hosts, hostA + ":2");
  EXPECT_EQ(trials[1].hosts, hostA + ":1," + hostB + ":1");
  EXPECT_LT(trials[1].start, trials[0].end);  // they met, so they overlapped
  EXPECT_LT(trials[0].start, trials[1].end);
  for (const auto& [i, a] : trials) {
    for (const auto& [j, b] : trials) {
      if (i >= j || !(a.start < b.end && b.start < a.end)) continue;
      for (const auto& s : a.slots) {
        EXPECT_EQ(std::count(b.slots.begin(), b.slots.end(), s), 0)
            << "trials " << i << " and " << j << " both held " << s.first << ":" << s.second;
      }
    }
  }

  // The ranks themselves: each started through ssh for the host of its slot (rank r on the
  // trial's r-th slot), with SHOAL_NUM_HOSTS the trial's hosts.
  std::istringstream lines(readFile(placements));
  std::string line;
  std::map<int, std::set<int>> ranksSeen;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    int trial = -1, rank = -1, localRank = -1, numHosts = 0;
    std::string host, slots;
    words >> trial >> rank >> host >> localRank >> numHosts >> slots;
    ASSERT_TRUE(trials.count(trial)) << line;
    const Trial& t = trials[trial];
    EXPECT_EQ(slotsOf(slots), t.slots) << line;
    ASSERT_TRUE(rank == 0 || rank == 1) << line;
    EXPECT_EQ(host, t.slots[static_cast<size_t>(rank)].first) << line;
    EXPECT_EQ(numHosts, t.hosts.find(',') == std::string::npos ? 1 : 2) << line;
    ranksSeen[trial].insert(rank);
  }
  EXPECT_EQ(ranksSeen.size(), 5u);
  for (const auto& [trial, ranks] : ranksSeen) EXPECT_EQ(ranks.size(), 2u) << "trial " << trial;

  const Json best = Json::parse(readFile(dir + "/best.json"));
  EXPECT_EQ(best["params"]["x"], 0.5);
  EXPECT_NEAR(best["metric"].get<double>(), 1 - 0.04, 1e-9);
  EXPECT_TRUE(best.contains("hosts"));
  EXPECT_NE(readFile(dir + "/results.csv").find(",reason,hosts\n"), std::string::npos);
}

TEST(SweepProcess, HostsErrors) {
  TempDir tmp;
  const auto configWith = [&](const std::string& extra) {
    return writeConfig(tmp.path, fmt::format(R"({{"command": ["{}"], "metric": "score", {}
      "parameters": {{"x": {{"type": "uniform", "low": 0, "high": 1}}}}}})",
                                             SHOAL_SWEEP_TRAINER, extra));
  };
  // More ranks per trial than slots: one line, exit 2, nothing started (no directory).
  auto r = runShell(fmt::format("{} sweep {} --dir {}/a --hosts localhost:2,127.0.0.1:2", SHOAL_BIN,
                                configWith(R"("ranks_per_trial": 5,)"), tmp.path));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ranks_per_trial 5 is more than the 4 slots"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.path + "/a"));
  // Trials started directly cannot go to hosts.
  r = runShell(fmt::format("{} sweep {} --dir {}/b --hosts localhost:2", SHOAL_BIN,
                           configWith(R"("launcher": "direct",)"), tmp.path));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--hosts needs trials started through `shoal run`"), std::string::npos)
      << r.output;
  // --ssh without hosts, both host forms, an unknown host, a malformed entry.
  const std::string plain = configWith("");
  for (const char* flags : {"--ssh ssh", "--hosts localhost:1 --hostfile /dev/null",
                            "--hosts no-such-host.invalid:1", "--hosts localhost:0"}) {
    r = runShell(fmt::format("{} sweep {} --dir {}/c {}", SHOAL_BIN, plain, tmp.path, flags));
    EXPECT_EQ(r.code, 2) << flags << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << flags << ": " << r.output;
  }
}
