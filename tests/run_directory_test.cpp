// Run directories (run/run_directory.h): the record `shoal run --run-dir` keeps of a job and its
// configuration (secrets never written), the git revision read from .git, the refusal of
// malformed records and of a folder that holds a run, and the Fashion-MNIST example's metrics
// from every rank in the run's store: the step time's three parts, and a slowed rank named as a
// straggler under a threshold it exceeds and not under one it does not.
#include "run/run_directory.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/process_util.h"
#include "track/metrics_store.h"

namespace shoal::test {
namespace {

void writeText(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(RunDirectory, RecordsASucceededAndAFailedJob) {
  TempDir dir;
  const std::string ok = dir.path + "/runs/ok";
  const RunResult r = shoalRun(
      SHOAL_BIN,
      {"-n", "2", "--run-dir", ok, "--", "sh", "-c",
       "test \"$SHOAL_RUN_DIR\" = \"" + ok + "\" && touch \"$SHOAL_RUN_DIR/seen.$SHOAL_RANK\""},
      dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(ok + "/seen.0"));
  EXPECT_TRUE(std::filesystem::exists(ok + "/seen.1"));
  const run::RunRecord rec = run::readRunRecord(ok);
  EXPECT_EQ(rec.name, "ok");
  EXPECT_EQ(rec.status, "succeeded");
  EXPECT_EQ(rec.exitCode, 0);
  EXPECT_EQ(rec.ranks, 2);
  EXPECT_EQ(rec.attempts, 1);
  ASSERT_FALSE(rec.command.empty());
  EXPECT_EQ(rec.command[0], "sh");
  EXPECT_EQ(rec.workingDirectory, std::filesystem::current_path().string());
  EXPECT_GT(rec.startedNs, 0);
  EXPECT_GE(rec.endedNs, rec.startedNs);
  // Where the tests run inside a git checkout, the revision is git's own answer.
  const ShellRun git = runShell("git rev-parse HEAD");
  if (git.code == 0) {
    EXPECT_EQ(rec.gitRevision, git.output.substr(0, 40)) << git.output;
  }

  // A failed job, restarted once: failed, with its exit code and both attempts.
  const std::string failed = dir.path + "/runs/failed";
  const RunResult f = shoalRun(
      SHOAL_BIN,
      {"-n", "1", "--max-restarts", "1", "--run-dir", failed, "--", "sh", "-c", "exit 3"}, dir);
  EXPECT_EQ(f.code, 3) << f.output;
  const run::RunRecord frec = run::readRunRecord(failed);
  EXPECT_EQ(frec.status, "failed");
  EXPECT_EQ(frec.exitCode, 3);
  EXPECT_EQ(frec.attempts, 2);

  // A folder that holds a run is never reused: one line, nothing started, the record intact.
  const RunResult again =
      shoalRun(SHOAL_BIN, {"-n", "1", "--run-dir", ok, "--", "touch", ok + "/started"}, dir);
  EXPECT_EQ(again.code, 2) << again.output;
  EXPECT_NE(again.output.find("already holds a run"), std::string::npos) << again.output;
  EXPECT_EQ(std::count(again.output.begin(), again.output.end(), '\n'), 1) << again.output;
  EXPECT_FALSE(std::filesystem::exists(ok + "/started"));
  EXPECT_EQ(run::readRunRecord(ok).status, "succeeded");
}

TEST(RunDirectory, RecordsTheConfigurationWithoutItsSecrets) {
  TempDir dir;
  const std::string run = dir.path + "/runs/configured";
  // Secrets three ways: the launcher's environment, -x NAME=VALUE and --env=NAME=VALUE. The ranks
  // get -x's (checked by its length: the program's command is recorded as it is given).
  const std::string secret = "s3cret-in-the-environment";
  Proc p({SHOAL_BIN, "run", "-n", "2", "--timeout", "30", "--run-dir", run, "-x",
          "SHOAL_TEST_TOKEN=t0ken-on-the-command-line", "--env=MY_PASSWORD=passw0rd-as-well", "-x",
          "SHOAL_LOG_LEVEL=info", "--", "sh", "-c", "test \"${#SHOAL_TEST_TOKEN}\" = 25"},
         dir.path + "/launcher.out", {{"SHOAL_SECRET", secret}, {"SHOAL_TRANSPORT", "tcp"}});
  ASSERT_EQ(p.wait(std::chrono::seconds(120)), 0) << readFile(dir.path + "/launcher.out");
  const std::string text = readFile(run + "/run.json");
  for (const std::string& s :
       {secret, std::string("t0ken-on-the-command-line"), std::string("passw0rd-as-well")}) {
    EXPECT_EQ(text.find(s), std::string::npos) << s << " written:\n" << text;
  }
  const nlohmann::json c = run::readRunRecord(run).configuration;
  ASSERT_TRUE(c.is_object()) << text;
  EXPECT_EQ(c["ranks"], 2);
  EXPECT_EQ(c["timeout_s"], 30.0);
  EXPECT_EQ(c["backend"], "native");
  EXPECT_EQ(c["environment"]["SHOAL_SECRET"], "<redacted>");
  EXPECT_EQ(c["environment"]["SHOAL_TEST_TOKEN"], "<redacted>");
  EXPECT_EQ(c["environment"]["SHOAL_TRANSPORT"], "tcp");
  EXPECT_EQ(c["environment"]["SHOAL_LOG_LEVEL"], "info");
  EXPECT_EQ(c["arguments"],
            nlohmann::json({"-n", "2", "--timeout", "30", "--run-dir", run, "-x",
                            "SHOAL_TEST_TOKEN=<redacted>", "--env=MY_PASSWORD=<redacted>", "-x",
                            "SHOAL_LOG_LEVEL=info"}));
  // What the launcher made itself is not the configuration.
  EXPECT_FALSE(c["environment"].contains("SHOAL_RANK"));
  EXPECT_FALSE(c["environment"].contains("SHOAL_RUN_DIR"));
}

TEST(RunDirectory, ReadsTheGitRevisionFromDotGit) {
  TempDir dir;
  const std::string a(40, 'a'), b(40, 'b'), c(40, 'c');
  const std::string repo = dir.path + "/repo";
  std::filesystem::create_directories(repo + "/src/deep");
  EXPECT_EQ(run::gitRevision(repo), std::nullopt);
  writeText(repo + "/.git/HEAD", "ref: refs/heads/main\n");
  writeText(repo + "/.git/packed-refs", "# pack-refs\n" + b + " refs/heads/main\n");
  EXPECT_EQ(run::gitRevision(repo + "/src/deep"), b);  // found from a subfolder, packed
  writeText(repo + "/.git/refs/heads/main", a + "\n");
  EXPECT_EQ(run::gitRevision(repo), a);  // a loose ref wins over the packed one
  writeText(repo + "/.git/HEAD", c + "\n");
  EXPECT_EQ(run::gitRevision(repo), c);  // a detached HEAD
  // A linked work tree: .git is a file naming its folder, whose refs live in the main one.
  const std::string tree = dir.path + "/tree";
  writeText(tree + "/.git", "gitdir: " + repo + "/.git/worktrees/t\n");
  writeText(repo + "/.git/worktrees/t/HEAD", "ref: refs/heads/main\n");
  writeText(repo + "/.git/worktrees/t/commondir", "../..\n");
  EXPECT_EQ(run::gitRevision(tree), a);
  // What is not a revision is not reported as one.
  writeText(repo + "/.git/HEAD", "ref: refs/heads/../../escape\n");
  EXPECT_EQ(run::gitRevision(repo), std::nullopt);
  writeText(repo + "/.git/HEAD", "garbage\n");
  EXPECT_EQ(run::gitRevision(repo), std::nullopt);
}

TEST(RunDirectory, RefusesAMalformedRecordInOneLine) {
  TempDir dir;
  run::RunRecord good;
  good.name = "x";
  good.command = {"prog"};
  run::writeRunRecord(dir.path, good);
  EXPECT_EQ(run::readRunRecord(dir.path).name, "x");
  const std::string text = readFile(dir.path + "/run.json");
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {"{", "parse"},
           {"[]", "not a Shoal run record"},
           {"{\"shoal_run\": 1}", "name"},
           {std::string(text).replace(text.find("\"running\""), 9, "\"maybe\""), "status 'maybe'"},
           {std::string(text).replace(text.find("\"ranks\": 0"), 10, "\"ranks\": \"two\""), "type"},
           {std::string(text).replace(text.find("\"configuration\": null"), 21,
                                      "\"configuration\": [1]"),
            "configuration: expected an object"}}) {
    writeText(dir.path + "/run.json", bad);
    try {
      run::readRunRecord(dir.path);
      ADD_FAILURE() << "read: " << bad;
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir.path + "/run.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  std::filesystem::remove(dir.path + "/run.json");
  EXPECT_THROW(run::readRunRecord(dir.path), InvalidArgument);
}

TEST(RunDirectory, EveryRankOfTheExampleReportsIntoTheRunsStore) {
  TempDir dir;
  const std::string run = dir.path + "/run";
  // 1024 samples / 2 ranks / 32 = 16 steps per rank.
  const RunResult r = shoalRun(SHOAL_BIN,
                               {"-n", "2", "--run-dir", run, "--", FASHION_MNIST_BIN, "--epochs",
                                "1", "--train-subset", "1024", "--batch", "32", "-q"},
                               dir, std::chrono::seconds(300));
  ASSERT_EQ(r.code, 0) << r.output;
  track::MetricsStore store(run::metricsPath(run), {.readOnly = true});
  for (int rank = 0; rank < 2; ++rank) {
    const auto loss = store.series("loss", {.rank = rank});
    ASSERT_EQ(loss.size(), 16u) << rank;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_EQ(loss[i].step, static_cast<int64_t>(i + 1)) << rank;
      EXPECT_GT(loss[i].value, 0) << rank;
    }
    const auto steps = store.series("step_time_s", {.rank = rank});
    EXPECT_EQ(steps.size(), 16u) << rank;
    EXPECT_EQ(store.series("comm_wait_s", {.rank = rank}).size(), 16u) << rank;
    // The step time's three parts, each step, adding up to it (Note [Step-time breakdown]).
    const auto compute = store.series("compute_s", {.rank = rank});
    const auto communication = store.series("communication_s", {.rank = rank});
    const auto waiting = store.series("waiting_s", {.rank = rank});
    ASSERT_EQ(compute.size(), steps.size()) << rank;
    ASSERT_EQ(communication.size(), steps.size()) << rank;
    ASSERT_EQ(waiting.size(), steps.size()) << rank;
    double blocked = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ(compute[i].step, steps[i].step);
      EXPECT_GE(compute[i].value, 0);
      EXPECT_GE(communication[i].value, 0);
      EXPECT_GE(waiting[i].value, 0);
      EXPECT_NEAR(compute[i].value + communication[i].value + waiting[i].value, steps[i].value,
                  1e-9 * steps[i].value + 1e-12)
          << rank << " step " << steps[i].step;
      blocked += communication[i].value + waiting[i].value;
    }
    EXPECT_GT(blocked, 0) << "a DDP rank waits for its buckets: rank " << rank;
  }
  const auto accuracy = store.latest("test_accuracy");
  ASSERT_EQ(accuracy.size(), 1u);
  EXPECT_EQ(accuracy[0].rank, 0);
  EXPECT_GT(accuracy[0].value, 0.1);  // better than chance after one epoch
  EXPECT_EQ(run::readRunRecord(run).status, "succeeded");
}

// The example's mean of a metric over one rank's steps.
double meanOf(track::MetricsStore& store, const std::string& name, int rank) {
  const auto points = store.series(name, {.rank = rank});
  double sum = 0;
  for (const auto& p : points) sum += p.value;
  return points.empty() ? 0 : sum / static_cast<double>(points.size());
}

TEST(RunDirectory, ASlowRankOfTheExampleIsNamedAsAStraggler) {
  // Rank 1 computes about 3x as long; windows of 4 steps, named after two slow ones in a row
  // (the first window may not count: both ranks warm up in it). The threshold is the job's:
  // 1.5 names it, 50 does not.
  const auto job = [](TempDir& dir, const std::string& threshold) {
    return shoalRun(SHOAL_BIN,
                    {"-n", "2", "--run-dir", dir.path + "/run", "--", FASHION_MNIST_BIN, "--epochs",
                     "1", "--train-subset", "1024", "--batch", "32", "-q", "--straggler-window",
                     "4", "--slow-rank", "1", "--straggler-threshold", threshold},
                    dir, std::chrono::seconds(300));
  };
  TempDir dir;
  const RunResult r = job(dir, "1.5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("stragglers at step "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("slower than 1.50x the median"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: compute"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0: compute"), std::string::npos) << r.output;
  track::MetricsStore store(run::metricsPath(dir.path + "/run"), {.readOnly = true});
  const auto ratio = store.series("compute_ratio", {.rank = 1});
  ASSERT_EQ(ratio.size(), 4u);
  for (size_t i = 1; i < ratio.size(); ++i) EXPECT_GT(ratio[i].value, 1.5) << ratio[i].step;
  // The job's verdict at each window: rank 1 named from its second slow window on, rank 0 never.
  const auto named = store.series("straggler", {.rank = 1});
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named.front().value, 0);
  EXPECT_EQ(named.back().value, 1);
  for (const auto& p : store.series("straggler", {.rank = 0})) EXPECT_EQ(p.value, 0) << p.step;
  // The fast rank spends the difference waiting for the slow one at each step's end; the slow
  // one finds the fast one's data there.
  EXPECT_GT(meanOf(store, "waiting_s", 0), meanOf(store, "waiting_s", 1));
  EXPECT_GT(meanOf(store, "compute_s", 1), meanOf(store, "compute_s", 0));

  TempDir lenient;
  const RunResult l = job(lenient, "50");
  ASSERT_EQ(l.code, 0) << l.output;
  EXPECT_EQ(l.output.find("stragglers at step "), std::string::npos) << l.output;
  track::MetricsStore lenientStore(run::metricsPath(lenient.path + "/run"), {.readOnly = true});
  EXPECT_EQ(lenientStore.series("compute_ratio", {.rank = 1}).size(), 4u);
  for (const auto& p : lenientStore.series("straggler", {.rank = 1})) EXPECT_EQ(p.value, 0);
  // The report follows the job's threshold: rank 1's compute_ratio of about 3 is no straggler
  // at 50 (the report's own rule, 1.3, would name it).
  const ShellRun report = runShell(fmt::format("{} report {}/run", SHOAL_BIN, lenient.path));
  ASSERT_EQ(report.code, 0) << report.output;
  std::ifstream in(lenient.path + "/run/report/report.html");
  const std::string html{std::istreambuf_iterator<char>(in), {}};
  EXPECT_NE(html.find("None (rule: named by the job's own monitor"), std::string::npos) << html;
  EXPECT_EQ(html.find("data-straggler"), std::string::npos) << html;
}

TEST(RunDirectory, TheExampleRefusesABadStragglerThreshold) {
  TempDir dir;
  for (const std::string bad : {"0", "-2", "1", "nan", "inf", "1.5x", "fast"}) {
    const ShellRun r = runShell(
        fmt::format("{} --straggler-threshold '{}' --epochs 1 -q", FASHION_MNIST_BIN, bad));
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("fashion_mnist: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--straggler-threshold"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

TEST(RunDirectory, TheExampleAutotunesItsBucketsAndAlgorithmAndEveryRankAgrees) {
  TempDir dir;
  const std::string run = dir.path + "/run";
  // FashionCnn's 1.7 MB of gradients: bucket 1 or 4 MiB (25 MiB makes 4 MiB's buckets) x overlap
  // x algorithm auto / ring / rabenseifner, 12 candidates: 12 x 4 + 6 x 7 + 3 x 13 + 2 x 25 =
  // 179 steps of the 192 in 3 epochs (4096 / 2 / 32 = 64 per epoch).
  const RunResult r = shoalRun(SHOAL_BIN,
                               {"-n", "2", "--run-dir", run, "--", FASHION_MNIST_BIN, "--epochs",
                                "3", "--train-subset", "4096", "--batch", "32", "-q", "--autotune"},
                               dir, std::chrono::seconds(300));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("autotune: chose bucket="), std::string::npos) << r.output;
  // The report lists every candidate's last trial: every algorithm and bucket size was tried.
  for (const char* tried :
       {"bucket=1MiB overlap=on alg=auto ", "bucket=1MiB overlap=off alg=ring ",
        "bucket=4MiB overlap=on alg=rabenseifner ", "bucket=4MiB overlap=off alg=auto "}) {
    EXPECT_NE(r.output.find(tried), std::string::npos) << tried << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("bucket=25MiB"), std::string::npos) << r.output;
  track::MetricsStore store(run::metricsPath(run), {.readOnly = true});
  const auto choice = store.series("autotune_choice");
  ASSERT_EQ(choice.size(), 2u);
  EXPECT_EQ(choice[0].value, choice[1].value);
  EXPECT_NE(choice[0].rank, choice[1].rank);
  EXPECT_EQ(choice[0].step, 179);
  EXPECT_EQ(choice[1].step, 179);
}

}  // namespace
}  // namespace shoal::test
