#include "run/sweep/sweep_results.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/trace_file.h"
#include "run/process_util.h"

namespace shoal::run::sweep {
namespace {

std::vector<std::string> bestArgv(const SweepConfig& c, const TrialRecord& t,
                                  const std::string& dir) {
  const std::string trialDir = std::filesystem::absolute(trialDirectory(dir, t.id)).string();
  std::vector<std::string> argv =
      trialCommand(c, t.params, t.id, trialDir, trialDir + "/metrics.jsonl");
  if (c.viaLauncher) {
    argv.insert(argv.begin(), {"shoal", "run", "-n", std::to_string(c.ranksPerTrial), "--"});
  }
  return argv;
}

std::string csvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

std::string metricText(double v) {
  return std::isnan(v) ? "" : fmt::format("{:.6g}", v);
}

}  // namespace

std::string bestCommandLine(const SweepConfig& config, const TrialRecord& best,
                            const std::string& dir) {
  // Quoted only where sh needs it, so the line reads as typed and pastes back as run.
  const auto word = [](const std::string& w) {
    const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](unsigned char c) {
      return std::isalnum(c) || std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
    });
    return plain ? w : shellQuote(w);
  };
  std::string line;
  for (const auto& [name, value] : config.env) line += name + "=" + word(value) + " ";
  for (const std::string& w : bestArgv(config, best, dir)) {
    if (!line.empty() && line.back() != ' ') line += ' ';
    line += word(w);
  }
  return line;
}

std::string formatResultsTable(const SweepConfig& c, const SweepResult& r, const std::string& dir) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"trial"};
  for (const Parameter& p : c.parameters) head.push_back(p.name);
  for (const char* h : {"", "status", "epochs", "seconds"}) head.push_back(h);
  head[c.parameters.size() + 1] = c.metric;
  rows.push_back(head);
  for (const TrialRecord& t : r.trials) {
    std::vector<std::string> row = {std::to_string(t.id)};
    for (size_t i = 0; i < t.params.size(); ++i) {
      row.push_back(displayParameter(c.parameters[i], t.params[i]));
    }
    row.push_back(metricText(t.metric));
    row.push_back(std::string(toString(t.status)));
    row.push_back(t.curve.empty() ? "0" : std::to_string(t.curve.back().epoch));
    row.push_back(fmt::format("{:.1f}", t.seconds));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(head.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string line;
    for (size_t i = 0; i < rows[k].size(); ++i) {
      line += fmt::format("{:<{}}", rows[k][i], width[i] + (i + 1 < rows[k].size() ? 2 : 0));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (k == 0) out += std::string(line.size(), '-') + "\n";
  }
  if (r.best) {
    const TrialRecord& b = r.trials[*r.best];
    std::string params;
    for (size_t i = 0; i < b.params.size(); ++i) {
      params += fmt::format("{}{}={}", params.empty() ? "" : " ", c.parameters[i].name,
                            displayParameter(c.parameters[i], b.params[i]));
    }
    out += fmt::format("best: trial {}: {}={} with {}\n", b.id, c.metric, metricText(b.metric),
                       params);
    out += fmt::format("command: {}\n", bestCommandLine(c, b, dir));
  } else {
    out += "best: none (no trial completed)\n";
  }
  return out;
}

void writeResultsCsv(const std::string& path, const SweepConfig& c, const SweepResult& r) {
  // A hosts column only when some trial ran on --hosts: a local sweep's file is as before.
  const bool hosts = std::any_of(r.trials.begin(), r.trials.end(),
                                 [](const TrialRecord& t) { return !t.hosts.empty(); });
  std::string text = "trial";
  // Fields are appended, never made as "," + field: GCC 12 warns falsely (-Wrestrict) on that.
  for (const Parameter& p : c.parameters) text += fmt::format(",{}", csvField(p.name));
  text += fmt::format(",{},status,epochs,seconds,reason{}\n", csvField(c.metric),
                      hosts ? ",hosts" : "");
  for (const TrialRecord& t : r.trials) {
    text += std::to_string(t.id);
    for (size_t i = 0; i < t.params.size(); ++i) {
      text += fmt::format(",{}", csvField(formatParameter(c.parameters[i], t.params[i])));
    }
    text += fmt::format(",{},{},{},{:.3f},{}", metricText(t.metric), toString(t.status),
                        t.curve.empty() ? 0 : t.curve.back().epoch, t.seconds, csvField(t.reason));
    if (hosts) text += fmt::format(",{}", csvField(t.hosts));
    text += '\n';
  }
  writeFileAtomically(path, text);
}

void writeBestJson(const std::string& path, const SweepConfig& c, const SweepResult& r,
                   const std::string& dir) {
  nlohmann::ordered_json j;
  if (!r.best) {
    j["trial"] = nullptr;
  } else {
    const TrialRecord& b = r.trials[*r.best];
    j["trial"] = b.id;
    j["metric"] = b.metric;
    j["metric_name"] = c.metric;
    nlohmann::ordered_json params = nlohmann::ordered_json::object();
    for (size_t i = 0; i < b.params.size(); ++i) {
      params[c.parameters[i].name] =
          nlohmann::ordered_json::parse(parameterJson(c.parameters[i], b.params[i]));
    }
    j["params"] = params;
    j["command"] = bestArgv(c, b, dir);
    nlohmann::ordered_json env = nlohmann::ordered_json::object();
    for (const auto& [name, value] : c.env) env[name] = value;
    j["env"] = env;
    j["seconds"] = b.seconds;
    if (!b.hosts.empty()) j["hosts"] = b.hosts;
  }
  writeFileAtomically(path, j.dump(2) + "\n");
}

}  // namespace shoal::run::sweep
