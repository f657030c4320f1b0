#include "tools/ui_server.h"

#include <arpa/inet.h>
#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/wall_clock.h"
#include "run/run_directory.h"
#include "tools/ui_page.h"
#include "track/metrics_store.h"

namespace shoal::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Runs listed at most: a folder of runs is not a database.
constexpr size_t kMaxRuns = 1000;
// Requests answered at once; a browser keeps up to 6 connections per host alive.
constexpr size_t kServerThreads = 8;

// Names and records come from the disk and may not be UTF-8: replace, never throw.
std::string dumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void answer(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_content(dumpJson(body), "application/json");
}

void answerError(httplib::Response& res, int status, const std::string& message) {
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  answer(res, status, json{{"error", line}});
}

// Compares in time that depends on the given text's length only, never on where it first differs
// from the token.
bool equalConstantTime(const std::string& given, const std::string& token) {
  unsigned char diff = given.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    const char t = i < token.size() ? token[i] : 0;
    diff |= static_cast<unsigned char>(given[i] ^ t);
  }
  return diff == 0;
}

// The host name of a Host header: "h:port", "[v6]:port" or "h".
std::string hostName(const std::string& header) {
  if (!header.empty() && header[0] == '[') {
    const size_t end = header.find(']');
    return end == std::string::npos ? header : header.substr(1, end - 1);
  }
  return header.substr(0, header.find(':'));
}

json recordJson(const run::RunRecord& r) {
  json j = run::toJson(r);
  const int64_t end = r.endedNs != 0 ? r.endedNs : wallClockNs();
  j["duration_s"] = r.startedNs > 0 ? std::max<double>(0, (end - r.startedNs) / 1e9) : 0.0;
  return j;
}

// The run's store opened for reading, or null when no rank has logged yet (no file).
std::unique_ptr<track::MetricsStore> openStore(const fs::path& dir) {
  const std::string path = run::metricsPath(dir.string());
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return nullptr;
  return std::make_unique<track::MetricsStore>(
      path, track::MetricsStoreOptions{.readOnly = true, .busyTimeout = kStoreBusyTimeout});
}

json rowJson(const track::MetricRow& row) {
  // NaN is written as null by nlohmann.
  return json{{"id", row.id},
              {"rank", row.rank},
              {"step", row.step},
              {"value", row.value},
              {"wall_ns", row.wallNs}};
}

}  // namespace

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool isValidRunName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
}

struct UiServer::Impl {
  explicit Impl(const UiOptions& o) : options(o) {}

  // The folder of run `name`, or nullopt (see the header: one component, a real subfolder of
  // RUNS_DIR after following links, holding run.json).
  std::optional<fs::path> resolveRun(const std::string& name) const {
    if (!isValidRunName(name)) return std::nullopt;
    std::error_code ec;
    const fs::path root = fs::canonical(options.runsDir, ec);
    if (ec) return std::nullopt;
    const fs::path dir = fs::canonical(root / name, ec);
    if (ec || dir.parent_path() != root || !fs::is_directory(dir, ec)) return std::nullopt;
    if (!fs::is_regular_file(dir / "run.json", ec)) return std::nullopt;
    return dir;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    if (options.token.empty()) {
      // DNS rebinding: a page from elsewhere reaches us under its own host name.
      const std::string host = req.get_header_value("Host");
      if (!host.empty() && !isLoopbackHost(hostName(host)) && hostName(host) != options.host) {
        answerError(res, 403, "Host '" + host + "' is not a loopback name");
        return false;
      }
      return true;
    }
    std::string given;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) {
      given = auth.substr(7);
    } else if (req.has_param("token")) {
      given = req.get_param_value("token");
    }
    if (given.empty() || !equalConstantTime(given, options.token)) {
      answerError(res, 401, given.empty() ? "a token is required" : "wrong token");
      return false;
    }
    return true;
  }

  void listRuns(httplib::Response& res) const {
    json runs = json::array();
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(options.runsDir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (isValidRunName(name) && fs::is_regular_file(it->path() / "run.json", ec)) {
        names.push_back(name);
      }
      if (names.size() >= kMaxRuns) break;
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const auto dir = resolveRun(name);
      if (!dir) continue;
      json j;
      try {
        run::RunRecord record = run::readRunRecord(dir->string());
        record.name = name;  // the folder's name is what URLs use
        j = recordJson(record);
      } catch (const std::exception& e) {
        j = json{{"name", name}, {"status", "unreadable"}, {"error", e.what()}};
      }
      j["metrics"] = json::array();
      try {
        if (auto store = openStore(*dir)) j["metrics"] = store->metricNames();
      } catch (const std::exception& e) {
        j["metrics_error"] = e.what();
      }
      runs.push_back(std::move(j));
    }
    answer(res, 200, json{{"runs", std::move(runs)}});
  }

  // Common to series and latest: the run, the metric, the store. False when answered already.
  bool openMetric(const httplib::Request& req, httplib::Response& res, fs::path& dir,
                  std::string& metric) const {
    const auto found = resolveRun(req.matches[1].str());
    if (!found) {
      answerError(res, 404, "no such run");
      return false;
    }
    dir = *found;
    metric = req.get_param_value("metric");
    if (metric.empty() || metric.size() > track::kMaxMetricNameBytes) {
      answerError(res, 400, "metric=NAME is required (at most 256 bytes)");
      return false;
    }
    return true;
  }

  void series(const httplib::Request& req, httplib::Response& res) const {
    fs::path dir;
    std::string metric;
    if (!openMetric(req, res, dir, metric)) return;
    track::SeriesQuery q;
    size_t limit = kMaxSeriesPoints;
    int64_t toStep = INT64_MAX;
    try {
      if (req.has_param("after")) {
        q.afterId = parseInteger("after", req.get_param_value("after"), 0, INT64_MAX);
      }
      if (req.has_param("from_step")) {
        q.fromStep =
            parseInteger("from_step", req.get_param_value("from_step"), INT64_MIN, INT64_MAX);
      }
      if (req.has_param("to_step")) {
        toStep = parseInteger("to_step", req.get_param_value("to_step"), INT64_MIN, INT64_MAX);
      }
      if (q.fromStep > toStep) {
        answerError(res, 400,
                    "from_step=" + std::to_string(q.fromStep) +
                        " is after to_step=" + std::to_string(toStep));
        return;
      }
      if (req.has_param("rank")) {
        q.rank = static_cast<int>(parseInteger("rank", req.get_param_value("rank"), 0, 1 << 20));
      }
      if (req.has_param("limit")) {
        limit = static_cast<size_t>(parseInteger("limit", req.get_param_value("limit"), 1,
                                                 static_cast<int64_t>(kMaxSeriesPoints)));
      }
    } catch (const std::exception& e) {
      answerError(res, 400, e.what());
      return;
    }
    // One more than asked for tells whether more are waiting.
    q.limit = limit + 1;
    std::vector<track::MetricRow> rows;
    auto store = openStore(dir);
    if (store) rows = store->series(metric, q);
    const bool more = rows.size() > limit;
    if (more) rows.resize(limit);
    json points = json::array();
    // to_step filters the page after the query: last_id still moves past what was filtered out,
    // so polling goes on from there.
    for (const auto& row : rows) {
      if (row.step <= toStep) points.push_back(rowJson(row));
    }
    answer(res, 200,
           json{{"run", dir.filename().string()},
                {"metric", metric},
                {"points", std::move(points)},
                {"last_id", rows.empty() ? q.afterId : rows.back().id},
                {"more", more}});
  }

  void latest(const httplib::Request& req, httplib::Response& res) const {
    fs::path dir;
    std::string metric;
    if (!openMetric(req, res, dir, metric)) return;
    json points = json::array();
    if (auto store = openStore(dir)) {
      for (const auto& row : store->latest(metric)) points.push_back(rowJson(row));
    }
    answer(
        res, 200,
        json{{"run", dir.filename().string()}, {"metric", metric}, {"latest", std::move(points)}});
  }

  void install() {
    server.set_read_timeout(kIoTimeout);
    server.set_write_timeout(kIoTimeout);
    server.set_keep_alive_timeout(kIoTimeout.count());
    server.set_payload_max_length(64 * 1024);  // only GETs are served
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_header("X-Frame-Options", "DENY");
      // Nothing but this page and its own API: no CDN, no other origin.
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                     "connect-src 'self'; img-src 'self' data:");
      const std::string_view page = uiPage();
      res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });
    server.Get("/api/runs",
               [this](const httplib::Request&, httplib::Response& res) { listRuns(res); });
    server.Get(R"(/api/runs/([^/]*)/series)",
               [this](const httplib::Request& req, httplib::Response& res) { series(req, res); });
    server.Get(R"(/api/runs/([^/]*)/latest)",
               [this](const httplib::Request& req, httplib::Response& res) { latest(req, res); });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          answerError(res, 500, what);
        });
    // Unknown routes and methods: the same one-line JSON as every other error.
    server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) {
        answerError(res, res.status, res.status == 404 ? "not found" : "request refused");
      }
    });
    // Called by the server thread once it is running (httplib sets its running flag first), so
    // that start() returns only when stop() can stop it.
    server.new_task_queue = [this] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        listening = true;
      }
      listeningChanged.notify_all();
      return new httplib::ThreadPool(kServerThreads);
    };
  }

  const UiOptions options;
  httplib::Server server;
  std::mutex mutex;
  std::condition_variable listeningChanged;
  bool listening = false;
};

UiServer::UiServer(UiOptions options) : options_(std::move(options)) {
  if (options_.port < 0 || options_.port > 65535) {
    SHOAL_THROW(InvalidArgument, "ui: port {} is not in 0..65535", options_.port);
  }
  if (options_.host.empty()) SHOAL_THROW(InvalidArgument, "ui: the host is empty");
  if (!isLoopbackHost(options_.host) && options_.token.empty()) {
    SHOAL_THROW(InvalidArgument,
                "ui: serving on {} (not loopback) needs a token (--token), or the runs are open "
                "to the network",
                options_.host);
  }
  for (char c : options_.token) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::strchr("._~-", c) == nullptr) {
      SHOAL_THROW(InvalidArgument, "ui: the token may hold only letters, digits and . _ ~ -");
    }
  }
}

UiServer::~UiServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    SHOAL_LOG_WARN("ui: stopping the server: {}", e.what());
  }
}

void UiServer::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (impl_) return;
  auto impl = std::make_unique<Impl>(options_);
  impl->install();
  int port = options_.port;
  if (port == 0) {
    port = impl->server.bind_to_any_port(options_.host);
  } else if (!impl->server.bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    SHOAL_THROW(SystemError, "ui: cannot listen on {}:{} (in use, or not an address of this host)",
                options_.host, options_.port);
  }
  Impl* raw = impl.get();
  thread_ = std::thread([raw] { raw->server.listen_after_bind(); });
  impl_ = std::move(impl);
  std::unique_lock<std::mutex> wait(raw->mutex);
  if (!raw->listeningChanged.wait_for(wait, kStartTimeout, [raw] { return raw->listening; })) {
    SHOAL_THROW(TimeoutError, "ui: the server thread did not start listening within {} s",
                kStartTimeout.count());
  }
  port_ = port;
}

void UiServer::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!impl_) return;
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
  impl_.reset();
  port_ = 0;
}

int UiServer::port() const {
  return port_.load();
}

std::string UiServer::url() const {
  const int p = port();
  if (p == 0) return "";
  const std::string host =
      options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
  std::string u = "http://" + host + ":" + std::to_string(p) + "/";
  if (!options_.token.empty()) u += "?token=" + options_.token;
  return u;
}

}  // namespace shoal::tools
