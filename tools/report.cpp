#include "tools/report.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/trace_file.h"
#include "run/run_directory.h"
#include "tools/plot.h"
#include "tools/run_summary.h"
#include "track/metrics_store.h"

namespace shoal::tools {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxStemBytes = 200;  // with ".png" and a suffix, well under NAME_MAX (255)
constexpr Rgb kMeanColor{0, 0, 0};

std::string utcTime(int64_t ns) {
  if (ns <= 0) return "";
  const time_t seconds = static_cast<time_t>(ns / 1'000'000'000);
  struct tm t {};
  gmtime_r(&seconds, &t);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &t);
  return buf;
}

std::string duration(double seconds) {
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const int64_t s = std::llround(seconds);
  if (s < 3600) return fmt::format("{}m {}s", s / 60, s % 60);
  return fmt::format("{}h {}m {}s", s / 3600, s / 60 % 60, s % 60);
}

// A shell-like rendering of the command, for reading (not for pasting back).
std::string joinCommand(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += ' ';
    const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](unsigned char c) {
      return std::isalnum(c) || std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
    });
    out += plain ? w : "'" + w + "'";
  }
  return out;
}

std::string cellValue(double v) {
  return std::isnan(v) ? "NaN" : formatValue(v);
}

void row(std::string& html, std::string_view key, std::string_view value) {
  html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", key, htmlEscape(value));
}

std::string recordTable(const run::RunRecord& r) {
  std::string html = "<table class=\"record\">\n";
  row(html, "name", r.name);
  row(html, "command", joinCommand(r.command));
  row(html, "working directory", r.workingDirectory);
  row(html, "status", r.status);
  row(html, "exit code", r.exitCode ? std::to_string(*r.exitCode) : "");
  row(html, "ranks", std::to_string(r.ranks));
  if (r.servers > 0) row(html, "servers", std::to_string(r.servers));
  if (r.elastic) row(html, "elastic", *r.elastic);
  std::string hosts;
  for (const std::string& h : r.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  row(html, "hosts", r.hosts.empty() ? "this machine" : hosts);
  row(html, "git revision", r.gitRevision.value_or(""));
  row(html, "start", utcTime(r.startedNs));
  row(html, "end", r.endedNs > 0 ? utcTime(r.endedNs) : "(running)");
  row(html, "duration",
      r.endedNs > r.startedNs && r.startedNs > 0 ? duration((r.endedNs - r.startedNs) / 1e9) : "");
  row(html, "attempts", std::to_string(r.attempts));
  return html + "</table>\n";
}

// A configuration value as one cell's text: strings as they are, the rest as JSON.
std::string configurationText(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// run.json's configuration (run/run_configuration.h), one row per entry, an object's entries
// (the environment) as key.NAME; absent (null) entries are left out.
std::string configurationSection(const run::RunRecord& r) {
  std::string html = "<h2>Configuration</h2>\n";
  if (!r.configuration.is_object()) return html + "<p>Not recorded.</p>\n";
  html += "<table class=\"record configuration\">\n";
  for (const auto& [key, value] : r.configuration.items()) {
    if (key == "arguments" && value.is_array() &&
        std::all_of(value.begin(), value.end(), [](const auto& a) { return a.is_string(); })) {
      row(html, key, joinCommand(value.get<std::vector<std::string>>()));
    } else if (value.is_object()) {
      for (const auto& [name, v] : value.items()) row(html, key + "." + name, configurationText(v));
    } else if (!value.is_null()) {
      row(html, key, configurationText(value));
    }
  }
  return html + "</table>\n";
}

Image metricChart(const MetricSummary& m) {
  std::vector<PlotSeries> lines;
  for (size_t i = 0; i < m.byRank.size(); ++i) {
    lines.push_back({.label = fmt::format("rank {}", m.byRank[i].first),
                     .points = m.byRank[i].second,
                     .color = seriesColor(static_cast<size_t>(m.byRank[i].first)),
                     .width = 1.5});
  }
  if (!m.mean.empty()) {
    lines.push_back(
        {.label = "mean over ranks", .points = m.mean, .color = kMeanColor, .width = 2.5});
  }
  return drawLineChart(lines, {.title = m.name});
}

std::string metricSection(const MetricSummary& m, const std::string& png) {
  std::string html = fmt::format(
      "<section class=\"metric\" id=\"m-{0}\">\n<h3>{1}</h3>\n"
      "<img src=\"{0}\" alt=\"{1}\" width=\"800\" height=\"360\">\n"
      "<table class=\"stats\">\n<tr><th>rank</th><th>points</th><th>last</th><th>min</th>"
      "<th>max</th><th>mean</th></tr>\n",
      htmlEscape(png), htmlEscape(m.name));
  for (const RankStats& s : m.stats) {
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", s.rank,
        s.count, cellValue(s.last), cellValue(s.min), cellValue(s.max), cellValue(s.mean));
  }
  return html + "</table>\n</section>\n";
}

// One rank's step as a bar of its three parts, as wide as the longest step (`top`) allows.
std::string stackedBar(const RankBreakdown& b, double top) {
  const auto part = [&](const char* name, double seconds) {
    return fmt::format("<span class=\"{}\" style=\"width: {:.2f}%\"></span>", name,
                       top > 0 ? 100 * seconds / top : 0.0);
  };
  return "<span class=\"bar\">" + part("compute", b.computeS) + part("comm", b.commS) +
         part("wait", b.waitS) + "</span>";
}

std::string breakdownSection(const RunSummary& s) {
  std::string html = "<h2>Step time per rank</h2>\n";
  if (s.breakdown.empty()) return html + "<p>No <code>step_time_s</code> logged.</p>\n";
  double top = 0;
  for (const RankBreakdown& b : s.breakdown) top = std::max(top, b.stepS);
  html +=
      "<p>Means over each rank's steps, in three parts: <span class=\"key compute\"></span> "
      "compute, <span class=\"key comm\"></span> communication (<code>communication_s</code>: "
      "blocked moving data), <span class=\"key wait\"></span> waiting (<code>waiting_s</code>: "
      "blocked on slower peers); compute is the rest of <code>step_time_s</code>. A run that "
      "logged only <code>comm_wait_s</code> shows it as communication. The ratio is compute over "
      "the median rank's.</p>\n<table class=\"breakdown\">\n<tr><th>rank</th><th>steps</th>"
      "<th>step time</th><th>compute</th><th>communication</th><th>waiting</th><th></th>"
      "<th>compute ratio</th><th>last compute_ratio</th><th></th></tr>\n";
  for (const RankBreakdown& b : s.breakdown) {
    html += fmt::format(
        "<tr data-rank=\"{}\"{}><td>{}</td><td>{}</td><td>{:.2f} ms</td><td>{:.2f} ms</td>"
        "<td>{:.2f} ms</td><td>{:.2f} ms</td><td>{}</td><td>{:.2f}</td><td>{}</td><td>{}</td>"
        "</tr>\n",
        b.rank, b.straggler ? " class=\"straggler\" data-straggler=\"1\"" : "", b.rank, b.steps,
        b.stepS * 1e3, b.computeS * 1e3, b.commS * 1e3, b.waitS * 1e3, stackedBar(b, top),
        b.computeRatio, b.lastComputeRatio ? cellValue(*b.lastComputeRatio) : "",
        b.straggler ? "<span class=\"tag\">straggler</span>" : "");
  }
  return html + "</table>\n";
}

std::string stragglerSection(const RunSummary& s) {
  std::string html = "<h2>Stragglers</h2>\n<p id=\"stragglers\">";
  std::string rule;
  switch (s.stragglerRule) {
    case StragglerRule::kJobVerdict:
      rule =
          "named by the job's own monitor in its last window, at the job's threshold "
          "(<code>straggler</code>)";
      break;
    case StragglerRule::kComputeRatio:
      rule = fmt::format("<code>compute_ratio</code> above {} in each rank's last {} windows",
                         kStragglerRatio, kStragglerWindows);
      break;
    case StragglerRule::kBreakdown:
      rule = fmt::format(
          "mean compute above {} times the median rank's, as no "
          "<code>compute_ratio</code> was logged",
          kStragglerRatio);
      break;
  }
  if (s.breakdown.empty() && s.stragglerRule == StragglerRule::kBreakdown) {
    return html + "Not known: no step times logged.</p>\n";
  }
  if (s.stragglers.empty()) return html + fmt::format("None (rule: {}).</p>\n", rule);
  std::string ranks;
  for (int r : s.stragglers) {
    ranks += fmt::format("{}<span class=\"straggler-rank\" data-rank=\"{}\">rank {}</span>",
                         ranks.empty() ? "" : ", ", r, r);
  }
  return html + fmt::format("Straggler: {} (rule: {}).</p>\n", ranks, rule);
}

constexpr std::string_view kStyle = R"(<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 24px; } h3 { font-size: 15px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #eee; }
td { font-variant-numeric: tabular-nums; }
.record td { font-family: monospace; word-break: break-all; }
img { display: block; border: 1px solid #ccc; background: #fff; max-width: 100%; height: auto; }
tr.straggler td { background: #fde8e8; }
.tag { color: #fff; background: #c22; border-radius: 3px; padding: 0 5px; font-weight: bold; }
.warn { color: #a40; }
.bar { display: inline-flex; width: 240px; height: 12px; background: #f0f0f0; }
.bar span, .key { display: inline-block; height: 12px; }
.key { width: 12px; vertical-align: middle; }
.compute { background: #3b7dd8; } .comm { background: #f0a030; } .wait { background: #c03030; }
</style>
)";

}  // namespace

std::string htmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string reportFileStem(std::string_view metric, std::set<std::string>& taken) {
  std::string stem;
  for (char c : metric.substr(0, kMaxStemBytes)) {
    const bool keep =
        std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
    stem += keep ? c : '_';
  }
  // No hidden files, and never "." or "..".
  for (char& c : stem) {
    if (c != '.') break;
    c = '_';
  }
  if (stem.empty()) stem.push_back('_');
  // Unique, also on a file system that ignores case.
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::string unique = stem;
  for (int i = 2; taken.count(lower(unique)) > 0; ++i) {
    unique = fmt::format("{}-{}", stem, i);
  }
  taken.insert(lower(unique));
  return unique;
}

ReportResult writeReport(const std::string& runDir, const std::string& outDir) {
  const run::RunRecord record = run::readRunRecord(runDir);
  const std::string out = outDir.empty() ? runDir + "/report" : outDir;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) {
    SHOAL_THROW(SystemError, "report folder {}: cannot create it: {}", out,
                ec ? ec.message() : "not a folder");
  }

  RunSummary summary;
  const std::string db = run::metricsPath(runDir);
  const bool haveMetrics = fs::exists(db);
  if (haveMetrics) {
    track::MetricsStore store(db, {.readOnly = true});
    summary = summarizeRun(store);
  }

  ReportResult result{.htmlPath = out + "/report.html"};
  std::string body;
  std::set<std::string> taken;
  std::string index;
  for (const MetricSummary& m : summary.metrics) {
    const std::string png = reportFileStem(m.name, taken) + ".png";
    writePng(out + "/" + png, metricChart(m));
    ++result.plots;
    index += fmt::format("<a href=\"#m-{}\">{}</a> ", htmlEscape(png), htmlEscape(m.name));
    body += metricSection(m, png);
  }

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>Shoal run {}</title>\n{}</head>\n<body>\n<h1>Shoal run {}</h1>\n",
      htmlEscape(record.name), kStyle, htmlEscape(record.name));
  html += recordTable(record);
  html += configurationSection(record);
  html += breakdownSection(summary);
  html += stragglerSection(summary);
  for (const track::DroppedPoints& d : summary.dropped) {
    html += fmt::format("<p class=\"warn\">rank {} dropped {} points (its buffer was full).</p>\n",
                        d.rank, d.count);
  }
  html += "<h2>Metrics</h2>\n";
  if (!haveMetrics) {
    html += "<p>No metrics.db in the run directory: the record only.</p>\n";
  } else if (summary.metrics.empty()) {
    html += "<p>No metrics logged.</p>\n";
  } else {
    html += "<p class=\"index\">" + index + "</p>\n" + body;
  }
  html += "</body>\n</html>\n";
  writeFileAtomically(result.htmlPath, html);
  return result;
}

}  // namespace shoal::tools
