// The dashboard (tools/ui_server.h): its JSON API in process (runs, series after a row id,
// latest, refused run names, tokens, Host checks), and the page itself in a real headless
// browser (Debian's chromium) against `shoal ui` as a real process, with a live run whose curve
// must advance between two loads.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/error.h"
#include "run/run_directory.h"
#include "tests/process_util.h"
#include "tools/ui_server.h"
#include "track/tracker.h"

namespace shoal::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A run directory RUNS/name with its record and an empty store.
std::string makeRun(const std::string& runs, const std::string& name, const std::string& status,
                    int ranks = 2) {
  const std::string dir = runs + "/" + name;
  fs::create_directories(dir);
  run::RunRecord r;
  r.name = name;
  r.command = {"train", "--epochs", "3"};
  r.workingDirectory = "/work";
  r.gitRevision = "0123456789abcdef0123456789abcdef01234567";
  r.ranks = ranks;
  r.startedNs = nowNs() - 90'000'000'000;
  r.status = status;
  if (status != "running") {
    r.endedNs = nowNs();
    r.exitCode = status == "succeeded" ? 0 : 1;
  }
  r.attempts = 1;
  // As run/run_configuration.h writes it, with a name that must reach the page as text only.
  r.configuration = {{"ranks", ranks},
                     {"store", nullptr},
                     {"arguments", {"-n", std::to_string(ranks), "-x", "SHOAL_SECRET=<redacted>"}},
                     {"environment", {{"SHOAL_SECRET", "<redacted>"}, {"SHOAL_TIMEOUT", "30"}}},
                     {"note", "<b>bold</b>"}};
  run::writeRunRecord(dir, r);
  return dir;
}

// Logs `metric` at steps [from, to) on each of `ranks` ranks (value: rank * 1000 + step) and
// waits until it is in the file.
void logSteps(const std::string& dir, const std::string& metric, int ranks, int from, int to) {
  for (int rank = 0; rank < ranks; ++rank) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = rank});
    for (int s = from; s < to; ++s) t.log(metric, s, rank * 1000 + s);
    t.flush(std::chrono::seconds(30));
  }
}

struct Answer {
  int status = 0;
  json body;
};

Answer get(int port, const std::string& path, const httplib::Headers& headers = {}) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  c.set_url_encode(false);  // the paths are sent exactly as written, escapes included
  auto res = c.Get(path, headers);
  if (!res) return {-1, json()};
  Answer a{res->status, json()};
  if (res->get_header_value("Content-Type").rfind("application/json", 0) == 0) {
    a.body = json::parse(res->body);
  } else {
    a.body = res->body;
  }
  return a;
}

class UiApi : public ::testing::Test {
 protected:
  void SetUp() override {
    runs = tmp.path + "/runs";
    alpha = makeRun(runs, "alpha", "succeeded");
    beta = makeRun(runs, "beta", "running");
    logSteps(alpha, "loss", 2, 0, 5);
    logSteps(beta, "loss", 1, 0, 3);
    logSteps(beta, "test_accuracy", 1, 0, 1);
    server = std::make_unique<tools::UiServer>(tools::UiOptions{.runsDir = runs});
    server->start();
    port = server->port();
    ASSERT_GT(port, 0);
  }

  TempDir tmp;
  std::string runs, alpha, beta;
  std::unique_ptr<tools::UiServer> server;
  int port = 0;
};

TEST_F(UiApi, ListsEveryRunWithItsRecordAndMetrics) {
  const Answer a = get(port, "/api/runs");
  ASSERT_EQ(a.status, 200) << a.body;
  const json& r = a.body["runs"];
  ASSERT_EQ(r.size(), 2u) << a.body;
  EXPECT_EQ(r[0]["name"], "alpha");
  EXPECT_EQ(r[0]["status"], "succeeded");
  EXPECT_EQ(r[0]["ranks"], 2);
  EXPECT_EQ(r[0]["exit_code"], 0);
  EXPECT_EQ(r[0]["git_revision"], "0123456789abcdef0123456789abcdef01234567");
  EXPECT_GT(r[0]["duration_s"].get<double>(), 80.0);
  EXPECT_EQ(r[0]["metrics"], json::array({"loss"}));
  EXPECT_EQ(r[0]["configuration"]["environment"]["SHOAL_TIMEOUT"], "30");
  EXPECT_EQ(r[1]["name"], "beta");
  EXPECT_EQ(r[1]["status"], "running");
  EXPECT_EQ(r[1]["metrics"], json::array({"loss", "test_accuracy"}));
}

TEST_F(UiApi, ARunWithoutMetricsYetIsListedWithNone) {
  makeRun(runs, "gamma", "running");
  const Answer a = get(port, "/api/runs");
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(a.body["runs"].size(), 3u);
  EXPECT_EQ(a.body["runs"][2]["metrics"], json::array());
  const Answer s = get(port, "/api/runs/gamma/series?metric=loss");
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(s.body["points"].empty());
  EXPECT_EQ(s.body["last_id"], 0);
}

TEST_F(UiApi, SeriesReturnsExactlyThePointsAndAfterOnlyNewerOnes) {
  Answer a = get(port, "/api/runs/alpha/series?metric=loss");
  ASSERT_EQ(a.status, 200) << a.body;
  const json& p = a.body["points"];
  ASSERT_EQ(p.size(), 10u);
  std::set<std::pair<int, int>> seen;
  for (const json& x : p) {
    const int rank = x["rank"], step = x["step"];
    EXPECT_EQ(x["value"].get<double>(), rank * 1000 + step);
    seen.emplace(rank, step);
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_FALSE(a.body["more"].get<bool>());
  const int64_t last = a.body["last_id"];
  EXPECT_EQ(last, p.back()["id"].get<int64_t>());

  Answer none = get(port, fmt::format("/api/runs/alpha/series?metric=loss&after={}", last));
  ASSERT_EQ(none.status, 200);
  EXPECT_TRUE(none.body["points"].empty());
  EXPECT_EQ(none.body["last_id"], last);

  logSteps(alpha, "loss", 2, 5, 8);
  Answer newer = get(port, fmt::format("/api/runs/alpha/series?metric=loss&after={}", last));
  ASSERT_EQ(newer.status, 200);
  ASSERT_EQ(newer.body["points"].size(), 6u);
  for (const json& x : newer.body["points"]) {
    EXPECT_GT(x["id"].get<int64_t>(), last);
    EXPECT_GE(x["step"].get<int>(), 5);
  }

  // Pages: at most `limit`, "more" while some are left; one rank only.
  Answer page = get(port, "/api/runs/alpha/series?metric=loss&limit=4");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.body["points"].size(), 4u);
  EXPECT_TRUE(page.body["more"].get<bool>());
  Answer rank1 = get(port, "/api/runs/alpha/series?metric=loss&rank=1");
  ASSERT_EQ(rank1.status, 200);
  EXPECT_EQ(rank1.body["points"].size(), 8u);
  for (const json& x : rank1.body["points"]) EXPECT_EQ(x["rank"], 1);
  // A metric never logged: no points.
  Answer other = get(port, "/api/runs/alpha/series?metric=nothing");
  ASSERT_EQ(other.status, 200);
  EXPECT_TRUE(other.body["points"].empty());
}

TEST_F(UiApi, LatestIsEachRanksNewestPoint) {
  const Answer a = get(port, "/api/runs/alpha/latest?metric=loss");
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(a.body["latest"].size(), 2u);
  EXPECT_EQ(a.body["latest"][0]["rank"], 0);
  EXPECT_EQ(a.body["latest"][0]["step"], 4);
  EXPECT_EQ(a.body["latest"][1]["value"].get<double>(), 1004.0);
}

TEST_F(UiApi, BadRunNamesAndParametersAreRefused) {
  // A folder outside RUNS_DIR that looks like a run, reachable only through escapes or a link.
  makeRun(tmp.path, "outside", "succeeded");
  logSteps(tmp.path + "/outside", "loss", 1, 0, 2);
  fs::create_directory_symlink(tmp.path + "/outside", runs + "/link");
  fs::create_directories(runs + "/norecord");
  for (const std::string name :
       {"..", "%2e%2e", "%2E%2E", ".", "missing", "norecord", "link", "..%2Foutside",
        "%2e%2e%2foutside", "%2Fetc", "%00", "alpha%00", "", "/", "//etc"}) {
    const Answer a = get(port, "/api/runs/" + name + "/series?metric=loss");
    EXPECT_TRUE(a.status == 404 || a.status == 400) << name << ": " << a.status;
    ASSERT_TRUE(a.body.is_object()) << name << ": " << a.body;
    EXPECT_TRUE(a.body.contains("error")) << name;
    EXPECT_FALSE(a.body.contains("points")) << name;
    const Answer l = get(port, "/api/runs/" + name + "/latest?metric=loss");
    EXPECT_TRUE(l.status == 404 || l.status == 400) << name << ": " << l.status;
  }
  // The link is not listed either.
  const Answer list = get(port, "/api/runs");
  EXPECT_EQ(list.body["runs"].size(), 2u) << list.body;
  EXPECT_EQ(get(port, "/api/runs/alpha/series").status, 400);
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&after=-1").status, 400);
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&after=5x").status, 400);
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&limit=0").status, 400);
  const Answer unknown = get(port, "/api/nothing");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_TRUE(unknown.body.contains("error"));
}

TEST_F(UiApi, SeriesTakesAStepRange) {
  // alpha: loss at steps 0..4 on ranks 0 and 1.
  const Answer a = get(port, "/api/runs/alpha/series?metric=loss&from_step=1&to_step=3");
  ASSERT_EQ(a.status, 200) << a.body;
  std::multiset<int> steps;
  for (const json& x : a.body["points"]) steps.insert(x["step"].get<int>());
  EXPECT_EQ(steps, (std::multiset<int>{1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&from_step=3").body["points"].size(), 4u);
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&to_step=0").body["points"].size(), 2u);
  EXPECT_EQ(get(port, "/api/runs/alpha/series?metric=loss&from_step=9").body["points"].size(), 0u);
  // Pages of 3 rows with to_step=1: some pages hold fewer points (rows past step 1 are left
  // out), last_id still moves on, and together they hold every point of steps 0 and 1.
  int64_t after = 0;
  std::multiset<int> paged;
  for (int page = 0; page < 10; ++page) {
    const Answer p = get(
        port, fmt::format("/api/runs/alpha/series?metric=loss&to_step=1&limit=3&after={}", after));
    ASSERT_EQ(p.status, 200) << p.body;
    EXPECT_LE(p.body["points"].size(), 3u);
    for (const json& x : p.body["points"]) paged.insert(x["step"].get<int>());
    const int64_t last = p.body["last_id"];
    if (!p.body["more"].get<bool>()) break;
    EXPECT_GT(last, after);
    after = last;
  }
  EXPECT_EQ(paged, (std::multiset<int>{0, 0, 1, 1}));
  // Bad numbers: 400 with one line naming the parameter.
  for (const auto& [query, word] : std::vector<std::pair<std::string, std::string>>{
           {"from_step=abc", "from_step"},
           {"to_step=1.5", "to_step"},
           {"from_step=99999999999999999999", "from_step"},
           {"to_step=", "to_step"},
           {"from_step=5&to_step=2", "from_step=5 is after to_step=2"}}) {
    const Answer bad = get(port, "/api/runs/alpha/series?metric=loss&" + query);
    EXPECT_EQ(bad.status, 400) << query << ": " << bad.body;
    ASSERT_TRUE(bad.body.contains("error")) << query;
    const std::string e = bad.body["error"];
    EXPECT_NE(e.find(word), std::string::npos) << query << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST_F(UiApi, ServesTheSelfContainedPage) {
  const Answer a = get(port, "/");
  ASSERT_EQ(a.status, 200);
  const std::string page = a.body.get<std::string>();
  EXPECT_NE(page.find("<canvas"), std::string::npos);
  EXPECT_NE(page.find("/api/runs"), std::string::npos);
  // Nothing from elsewhere: no script, style or image from another address.
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);
  EXPECT_EQ(page.find("href=\"http"), std::string::npos);
  EXPECT_EQ(page.find("@import"), std::string::npos);
}

TEST_F(UiApi, AForeignHostHeaderIsRefusedWithoutAToken) {
  EXPECT_EQ(get(port, "/api/runs", {{"Host", "attacker.example:80"}}).status, 403);
  EXPECT_EQ(get(port, "/api/runs", {{"Host", "localhost:1234"}}).status, 200);
}

TEST_F(UiApi, StopIsIdempotentAndEndsServing) {
  server->stop();
  server->stop();
  EXPECT_EQ(server->port(), 0);
  EXPECT_EQ(get(port, "/api/runs").status, -1);
  server->start();
  EXPECT_EQ(get(server->port(), "/api/runs").status, 200);
}

TEST(UiSecurity, ANonLoopbackAddressNeedsAToken) {
  EXPECT_THROW(tools::UiServer({.host = "0.0.0.0"}), InvalidArgument);
  EXPECT_THROW(tools::UiServer({.host = "192.168.1.7"}), InvalidArgument);
  EXPECT_NO_THROW(tools::UiServer({.host = "0.0.0.0", .token = "abc"}));
  EXPECT_NO_THROW(tools::UiServer({.host = "127.0.0.2"}));
  EXPECT_NO_THROW(tools::UiServer({.host = "localhost"}));
  EXPECT_THROW(tools::UiServer({.host = "0.0.0.0", .token = "a b"}), InvalidArgument);
  EXPECT_THROW(tools::UiServer({.port = 70000}), InvalidArgument);
}

TEST(UiSecurity, WithATokenEveryRequestMustCarryIt) {
  TempDir tmp;
  makeRun(tmp.path, "alpha", "succeeded");
  tools::UiServer server({.runsDir = tmp.path, .token = "s3cret-Token_1"});
  server.start();
  const int port = server.port();
  EXPECT_EQ(server.url(), fmt::format("http://127.0.0.1:{}/?token=s3cret-Token_1", port));
  for (const std::string path : {"/", "/api/runs", "/api/runs/alpha/series?metric=loss"}) {
    const std::string sep = path.find('?') == std::string::npos ? "?" : "&";
    const Answer none = get(port, path);
    EXPECT_EQ(none.status, 401) << path;
    EXPECT_TRUE(none.body.contains("error")) << path;
    EXPECT_EQ(get(port, path + sep + "token=s3cret-Token_2").status, 401) << path;
    EXPECT_EQ(get(port, path + sep + "token=s3cret-Token_").status, 401) << path;
    EXPECT_EQ(get(port, path, {{"Authorization", "Bearer wrong"}}).status, 401) << path;
    EXPECT_EQ(get(port, path + sep + "token=s3cret-Token_1").status, 200) << path;
    EXPECT_EQ(get(port, path, {{"Authorization", "Bearer s3cret-Token_1"}}).status, 200) << path;
  }
}

TEST(UiNames, OnlyOnePathComponent) {
  EXPECT_TRUE(tools::isValidRunName("run-1.2_x"));
  EXPECT_FALSE(tools::isValidRunName(""));
  EXPECT_FALSE(tools::isValidRunName("."));
  EXPECT_FALSE(tools::isValidRunName(".."));
  EXPECT_FALSE(tools::isValidRunName("a/b"));
  EXPECT_FALSE(tools::isValidRunName("/etc"));
  EXPECT_FALSE(tools::isValidRunName("a\\b"));
  EXPECT_FALSE(tools::isValidRunName(std::string("a\0b", 3)));
  EXPECT_FALSE(tools::isValidRunName(std::string(256, 'a')));
}

// --- The page in a real browser ----------------------------------------------------------------

// data-points of the live run's curve in a dumped DOM; -1 if there is none.
int curvePoints(const std::string& dom, const std::string& run) {
  const std::regex curve("<canvas[^>]*class=\"curve\"[^>]*>");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), curve); it != std::sregex_iterator();
       ++it) {
    const std::string tag = it->str();
    if (tag.find("data-run=\"" + run + "\"") == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(tag, m, std::regex("data-points=\"([0-9]+)\""))) return std::stoi(m[1]);
  }
  return -1;
}

// The address a `shoal ui` process says it serves at (waiting for its line, at most 30 s), or
// empty if it did not say.
std::string servingUrl(Proc& ui) {
  if (!ui.waitForOutput([](const std::string& out) { return out.find("/\n") != std::string::npos; },
                        std::chrono::seconds(30))) {
    return "";
  }
  std::smatch m;
  const std::string out = ui.output();
  if (!std::regex_search(out, m, std::regex("shoal ui: serving .* at (http://[^ \n]+)"))) return "";
  return m[1];
}

// Each breakdown row (div.brow) of `run`'s panel in a dumped DOM: rank -> the row's opening tag
// and text up to the next row.
std::map<int, std::string> breakdownRows(const std::string& dom, const std::string& run) {
  std::map<int, std::string> rows;
  const size_t panel = dom.find("class=\"breakdown\" data-run=\"" + run + "\"");
  if (panel == std::string::npos) return rows;
  const size_t end = dom.find("</div></div>", panel);  // the breakdown's end closes its last row
  const std::string part =
      dom.substr(panel, end == std::string::npos ? std::string::npos : end - panel);
  const std::regex row("<div class=\"brow[^\"]*\" data-rank=\"([0-9]+)\"");
  std::vector<std::pair<int, size_t>> starts;
  for (auto it = std::sregex_iterator(part.begin(), part.end(), row); it != std::sregex_iterator();
       ++it) {
    starts.emplace_back(std::stoi((*it)[1]), static_cast<size_t>(it->position()));
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t to = i + 1 < starts.size() ? starts[i + 1].second : part.size();
    rows[starts[i].first] = part.substr(starts[i].second, to - starts[i].second);
  }
  return rows;
}

// A breakdown row's data-NAME attribute as a number (NaN if it has none).
double rowSeconds(const std::string& row, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(row, m, std::regex("data-" + name + "=\"([^\"]*)\""))) return NAN;
  return std::stod(m[1]);
}

// `run`'s configuration element (details.configuration) in a dumped DOM; empty if none.
std::string configurationOf(const std::string& dom, const std::string& run) {
  const size_t at = dom.find("<details class=\"configuration\" data-run=\"" + run + "\"");
  if (at == std::string::npos) return "";
  const size_t end = dom.find("</details>", at);
  return dom.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

class Chromium {
 public:
  explicit Chromium(const std::string& dir) : dir_(dir) { fs::create_directories(dir); }

  // One headless load of `url`; what chromium prints on stdout (the DOM with --dump-dom).
  // Bounded: `timeout` kills a chromium that hangs.
  std::string load(const std::string& url, const std::string& extra) {
    const std::string profile = dir_ + "/profile" + std::to_string(calls_++);
    const std::string cmd = fmt::format(
        "(timeout -k 5 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
        "--no-first-run --disable-extensions --disable-background-networking "
        "--user-data-dir={} --virtual-time-budget=6000 {} '{}' 2>{}/chromium.err)",
        profile, extra, url, dir_);
    const ShellRun r = runShell(cmd);
    EXPECT_EQ(r.code, 0) << readFile(dir_ + "/chromium.err");
    return r.output;
  }

 private:
  std::string dir_;
  int calls_ = 0;
};

TEST(UiBrowser, ThePageShowsTheRunsAndALiveCurveAdvances) {
  // The browser is part of the setup (scripts/setup.sh): missing, this test fails.
  ASSERT_EQ(runShell("command -v chromium").code, 0) << "chromium is not installed";
  TempDir tmp;
  const std::string runs = tmp.path + "/runs";
  const std::string done = makeRun(runs, "finished", "succeeded");
  const std::string live = makeRun(runs, "live", "running");
  logSteps(done, "loss", 2, 0, 10);
  // The live job: two ranks logging as fashion_mnist does, each step flushed.
  std::vector<std::unique_ptr<track::Tracker>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<track::Tracker>(
        track::TrackerOptions{.path = run::metricsPath(live), .rank = r}));
  }
  int step = 0;
  auto train = [&](int steps) {
    for (int i = 0; i < steps; ++i, ++step) {
      for (int r = 0; r < 2; ++r) {
        ranks[r]->log("loss", step, 2.0 / (1 + step) + 0.1 * r);
        ranks[r]->log("step_time_s", step, 0.05 + 0.01 * r);
        ranks[r]->log("comm_wait_s", step, 0.01 * (r + 1));
        // The three parts: rank 0 waits 20 ms for rank 1 (compute 20 ms against 45 ms).
        ranks[r]->log("compute_s", step, r == 0 ? 0.02 : 0.045);
        ranks[r]->log("communication_s", step, r == 0 ? 0.01 : 0.015);
        ranks[r]->log("waiting_s", step, r == 0 ? 0.02 : 0.0);
      }
    }
    for (auto& t : ranks) t->flush(std::chrono::seconds(30));
  };
  train(15);

  Proc ui({SHOAL_BIN, "ui", runs, "--port", "0"}, tmp.path + "/ui.out");
  const std::string url = servingUrl(ui);
  ASSERT_FALSE(url.empty()) << ui.output();

  Chromium chromium(tmp.path + "/chromium");
  const std::string first = chromium.load(url, "--dump-dom");
  EXPECT_NE(first.find("<tr data-run=\"finished\""), std::string::npos) << first;
  EXPECT_NE(first.find("<tr data-run=\"live\""), std::string::npos) << first;
  EXPECT_EQ(curvePoints(first, "finished"), 20) << first;
  const int before = curvePoints(first, "live");
  EXPECT_EQ(before, 30) << first;  // every point logged so far, 15 steps x 2 ranks
  EXPECT_NE(first.find("class=\"breakdown\" data-run=\"live\" data-ranks=\"2\""), std::string::npos)
      << first;
  // Each rank's step time in three parts, each a part of its stacked bar.
  const std::map<int, std::string> rows = breakdownRows(first, "live");
  ASSERT_EQ(rows.size(), 2u) << first;
  const std::map<int, std::array<double, 3>> parts = {{0, {0.02, 0.01, 0.02}},
                                                      {1, {0.045, 0.015, 0.0}}};
  for (const auto& [rank, html] : rows) {
    const std::array<double, 3> got = {rowSeconds(html, "compute-s"), rowSeconds(html, "comm-s"),
                                       rowSeconds(html, "wait-s")};
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], parts.at(rank)[i], 1e-9) << rank << html;
    for (const char* part : {"compute", "comm", "wait"}) {
      EXPECT_NE(html.find(fmt::format("<span class=\"{}\" style=\"width:", part)),
                std::string::npos)
          << part << ": " << html;
    }
  }
  // The run's configuration, as text (the markup in it is not markup on the page).
  const std::string config = configurationOf(first, "live");
  EXPECT_NE(config.find("data-key=\"environment.SHOAL_SECRET\"><td>environment.SHOAL_SECRET"
                        "</td><td>&lt;redacted&gt;</td>"),
            std::string::npos)
      << config;
  EXPECT_NE(config.find("<td>note</td><td>&lt;b&gt;bold&lt;/b&gt;</td>"), std::string::npos)
      << config;
  EXPECT_NE(config.find("data-entries=\"5\""), std::string::npos) << config;  // store is null

  train(10);
  const std::string second = chromium.load(url, "--dump-dom");
  const int after = curvePoints(second, "live");
  EXPECT_EQ(after, 50) << second;
  EXPECT_GT(after, before);

  const std::string png = tmp.path + "/dashboard.png";
  chromium.load(url, "--screenshot=" + png + " --window-size=1280,900 --hide-scrollbars");
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 20u * 1024);
  const std::string bytes = readFile(png);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // Kept for people looking at a failure (and at the page): the build folder outlives TempDir.
  std::error_code ec;
  fs::copy_file(png, "ui_dashboard.png", fs::copy_options::overwrite_existing, ec);

  // SIGTERM ends the server cleanly.
  ::kill(ui.pid(), SIGTERM);
  EXPECT_EQ(ui.wait(std::chrono::seconds(15)), 0) << ui.output();
}

// The data-* attributes of `run`'s timeline canvas in a dumped DOM (empty: no such canvas).
std::map<std::string, std::string> timelineAttributes(const std::string& dom,
                                                      const std::string& run) {
  std::map<std::string, std::string> attrs;
  const std::regex canvas("<canvas[^>]*class=\"timeline\"[^>]*>");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), canvas); it != std::sregex_iterator();
       ++it) {
    const std::string tag = it->str();
    if (tag.find("data-run=\"" + run + "\"") == std::string::npos) continue;
    const std::regex attr("data-([a-z-]+)=\"([^\"]*)\"");
    for (auto a = std::sregex_iterator(tag.begin(), tag.end(), attr); a != std::sregex_iterator();
         ++a) {
      attrs[(*a)[1]] = (*a)[2];
    }
  }
  return attrs;
}

TEST(UiBrowser, TheTimelineShowsTheChosenWindow) {
  ASSERT_EQ(runShell("command -v chromium").code, 0) << "chromium is not installed";
  TempDir tmp;
  const std::string runs = tmp.path + "/runs";
  const std::string dir = makeRun(runs, "long", "succeeded");
  for (int r = 0; r < 2; ++r) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = r});
    for (int step = 0; step < 40; ++step) {
      t.log("loss", step, 1.0 / (1 + step));
      t.log("step_time_s", step, 0.02 + 0.001 * (step % 5));
      t.log("comm_wait_s", step, 0.005);
    }
    t.flush(std::chrono::seconds(30));
  }
  Proc ui({SHOAL_BIN, "ui", runs, "--port", "0"}, tmp.path + "/ui.out");
  const std::string url = servingUrl(ui);
  ASSERT_FALSE(url.empty()) << ui.output();
  Chromium chromium(tmp.path + "/chromium");
  const auto view = [&](const std::string& query) {
    const std::string dom = chromium.load(url + query, "--dump-dom");
    return std::make_pair(timelineAttributes(dom, "long"), dom);
  };

  // Steps 10..14, as the address names them.
  auto [chosen, dom2] = view("?from_step=10&steps=5");
  EXPECT_EQ(chosen["first-step"], "10") << dom2;
  EXPECT_EQ(chosen["last-step"], "14");
  EXPECT_EQ(chosen["steps"], "10");  // 5 steps x 2 ranks
  EXPECT_EQ(chosen["from-step"], "10");
  EXPECT_EQ(chosen["window"], "5");
  EXPECT_NE(dom2.find("timeline of steps 10 to 14, drawn 10 to 14"), std::string::npos) << dom2;
  EXPECT_EQ(dom2.find("data-error=\"1\""), std::string::npos) << dom2;

  // A window reaching past the last step logged: what there is of it.
  auto [tail, dom3] = view("?from_step=35&steps=10");
  EXPECT_EQ(tail["first-step"], "35") << dom3;
  EXPECT_EQ(tail["last-step"], "39");
  EXPECT_EQ(tail["steps"], "10");
  // Past everything: nothing drawn, and said so.
  auto [beyond, dom4] = view("?from_step=100&steps=5");
  EXPECT_EQ(beyond["steps"], "0") << dom4;
  EXPECT_EQ(beyond["first-step"], "");
  EXPECT_NE(dom4.find("none logged there"), std::string::npos) << dom4;

  // Bad numbers: one line saying which, and meanwhile the default, the last 20 steps of each
  // rank.
  auto [bad, dom5] = view("?from_step=ten&steps=0");
  EXPECT_NE(dom5.find("id=\"window-error\" data-error=\"1\""), std::string::npos) << dom5;
  EXPECT_NE(dom5.find("from step: expected a whole number"), std::string::npos) << dom5;
  EXPECT_NE(dom5.find("steps: expected a whole number from 1 to 2000"), std::string::npos) << dom5;
  EXPECT_EQ(bad["first-step"], "20");
  EXPECT_EQ(bad["last-step"], "39");
  EXPECT_EQ(bad["steps"], "40");
  EXPECT_EQ(bad["from-step"], "");
  EXPECT_EQ(bad["window"], "20");
  EXPECT_NE(dom5.find("timeline of the last 20 steps, drawn 20 to 39"), std::string::npos) << dom5;

  const std::string png = tmp.path + "/timeline.png";
  chromium.load(url + "?from_step=10&steps=5",
                "--screenshot=" + png + " --window-size=1280,900 --hide-scrollbars");
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 20u * 1024);
  EXPECT_EQ(readFile(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::error_code ec;
  fs::copy_file(png, "ui_timeline_window.png", fs::copy_options::overwrite_existing, ec);

  ::kill(ui.pid(), SIGTERM);
  EXPECT_EQ(ui.wait(std::chrono::seconds(15)), 0) << ui.output();
}

TEST(UiBrowser, AStragglersRowIsMarked) {
  ASSERT_EQ(runShell("command -v chromium").code, 0) << "chromium is not installed";
  TempDir tmp;
  const std::string runs = tmp.path + "/runs";
  const std::string dir = makeRun(runs, "slow", "succeeded", 3);
  // Rank 1 computes twice as long as ranks 0 and 2 (40 ms against 20 ms); it also logs the
  // job's compute_ratio, which the row shows.
  for (int r = 0; r < 3; ++r) {
    track::Tracker t({.path = run::metricsPath(dir), .rank = r});
    for (int step = 0; step < 12; ++step) {
      t.log("loss", step, 1.0 / (1 + step));
      t.log("step_time_s", step, r == 1 ? 0.05 : 0.03);
      t.log("comm_wait_s", step, 0.01);
    }
    t.log("compute_ratio", 10, r == 1 ? 2.0 : 1.0);
    t.flush(std::chrono::seconds(30));
  }
  // The same times, but the job's own monitor (at a threshold of, say, 3) named nobody: its
  // verdict decides, not the page's 1.3.
  const std::string lenient = makeRun(runs, "lenient", "succeeded", 3);
  for (int r = 0; r < 3; ++r) {
    track::Tracker t({.path = run::metricsPath(lenient), .rank = r});
    for (int step = 0; step < 12; ++step) {
      t.log("step_time_s", step, r == 1 ? 0.05 : 0.03);
      t.log("comm_wait_s", step, 0.01);
    }
    t.log("compute_ratio", 10, r == 1 ? 2.0 : 1.0);
    t.log("straggler", 10, 0.0);
    t.flush(std::chrono::seconds(30));
  }
  Proc ui({SHOAL_BIN, "ui", runs, "--port", "0"}, tmp.path + "/ui.out");
  const std::string url = servingUrl(ui);
  ASSERT_FALSE(url.empty()) << ui.output();
  Chromium chromium(tmp.path + "/chromium");
  const std::string dom = chromium.load(url, "--dump-dom");
  const std::map<int, std::string> rows = breakdownRows(dom, "slow");
  ASSERT_EQ(rows.size(), 3u) << dom;
  for (const auto& [rank, html] : rows) {
    const bool marked = html.find("data-straggler=\"1\"") != std::string::npos;
    EXPECT_EQ(marked, rank == 1) << rank << ": " << html;
    EXPECT_EQ(html.find(">straggler</span>") != std::string::npos, rank == 1) << html;
    EXPECT_NE(html.find(rank == 1 ? "compute_ratio 2" : "compute_ratio 1"), std::string::npos)
        << html;
  }
  const std::map<int, std::string> lenientRows = breakdownRows(dom, "lenient");
  ASSERT_EQ(lenientRows.size(), 3u) << dom;
  for (const auto& [rank, html] : lenientRows) {
    EXPECT_EQ(html.find("data-straggler"), std::string::npos) << rank << ": " << html;
  }
  ::kill(ui.pid(), SIGTERM);
  EXPECT_EQ(ui.wait(std::chrono::seconds(15)), 0) << ui.output();
}

}  // namespace
}  // namespace shoal::test
