#include "run/sweep/search_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"

namespace shoal::run::sweep {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxParameters = 64;
constexpr size_t kMaxChoices = 1024;
constexpr int kMaxTrials = 1'000'000;

[[noreturn]] void fail(std::string_view key, std::string_view what) {
  SHOAL_THROW(InvalidArgument, "sweep config: {}: {}", key, what);
}

void checkKeys(const Json& object, std::string_view where,
               std::initializer_list<const char*> keys) {
  for (const auto& [key, value] : object.items()) {
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
      std::string known;
      for (const char* k : keys) known += (known.empty() ? "" : ", ") + std::string(k);
      fail(where.empty() ? key : fmt::format("{}.{}", where, key),
           fmt::format("unknown key (the keys: {})", known));
    }
  }
}

double number(const Json& v, const std::string& key) {
  if (!v.is_number()) fail(key, fmt::format("expected a number, got {}", v.dump()));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(key, "expected a finite number");
  return d;
}

int64_t integer(const Json& v, const std::string& key, int64_t min, int64_t max) {
  if (!v.is_number_integer() &&
      !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
    fail(key, fmt::format("expected an integer, got {}", v.dump()));
  }
  const double d = v.get<double>();
  if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
    fail(key, fmt::format("expected an integer from {} to {}, got {}", min, max, v.dump()));
  }
  return static_cast<int64_t>(d);
}

double seconds(const Json& v, const std::string& key) {
  const double s = number(v, key);
  if (s <= 0 || s > kMaxSeconds) fail(key, fmt::format("expected seconds in (0, {}]", kMaxSeconds));
  return s;
}

std::string text(const Json& v, const std::string& key) {
  if (!v.is_string()) fail(key, fmt::format("expected a string, got {}", v.dump()));
  return v.get<std::string>();
}

bool isName(const std::string& s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-' || c == '.';
  });
}

Parameter parseParameter(const std::string& name, const Json& j) {
  const std::string at = "parameters." + name;
  if (!isName(name))
    fail(at, "a parameter's name is letters, digits, '_', '-' or '.' (at most 64)");
  if (name == "metrics" || name == "trial" || name == "trial_dir") {
    fail(at, "the name is taken by a placeholder ({metrics}, {trial}, {trial_dir})");
  }
  if (!j.is_object()) fail(at, "expected an object like {\"type\": \"uniform\", ...}");
  if (!j.contains("type")) fail(at + ".type", "missing (uniform, log_uniform, int or choice)");
  Parameter p;
  p.name = name;
  p.flag = "--" + name;
  const std::string type = text(j["type"], at + ".type");
  if (type == "choice") {
    checkKeys(j, at, {"type", "values", "flag"});
    if (!j.contains("values")) fail(at + ".values", "missing (a list of values)");
    const Json& values = j["values"];
    if (!values.is_array() || values.empty()) fail(at + ".values", "expected a non-empty list");
    if (values.size() > kMaxChoices) fail(at + ".values", fmt::format("more than {}", kMaxChoices));
    p.kind = ParamKind::kChoice;
    std::set<std::string> seen;
    for (const Json& v : values) {
      if (!v.is_primitive() || v.is_null()) {
        fail(at + ".values", fmt::format("{} is not a string, number or boolean", v.dump()));
      }
      if (!seen.insert(v.dump()).second) fail(at + ".values", fmt::format("{} twice", v.dump()));
      p.choices.push_back(v.dump());
    }
  } else if (type == "uniform" || type == "log_uniform" || type == "int") {
    checkKeys(j, at, {"type", "low", "high", "log", "flag", "grid_points"});
    if (!j.contains("low")) fail(at + ".low", "missing");
    if (!j.contains("high")) fail(at + ".high", "missing");
    p.kind = type == "uniform" ? ParamKind::kUniform
             : type == "int"   ? ParamKind::kInt
                               : ParamKind::kLogUniform;
    if (p.kind == ParamKind::kInt) {
      constexpr int64_t kLimit = int64_t{1} << 52;  // exact in a double
      p.low = static_cast<double>(integer(j["low"], at + ".low", -kLimit, kLimit));
      p.high = static_cast<double>(integer(j["high"], at + ".high", -kLimit, kLimit));
    } else {
      p.low = number(j["low"], at + ".low");
      p.high = number(j["high"], at + ".high");
    }
    if (!(p.low < p.high)) {
      fail(at + ".low",
           fmt::format("must be below high ({} vs {})", j["low"].dump(), j["high"].dump()));
    }
    p.log = p.kind == ParamKind::kLogUniform;
    if (j.contains("log")) {
      if (!j["log"].is_boolean()) fail(at + ".log", "expected true or false");
      if (p.kind != ParamKind::kInt) fail(at + ".log", "only for int (use log_uniform)");
      p.log = j["log"].get<bool>();
    }
    if (p.log && p.low <= 0) {
      fail(at + ".low", fmt::format("a log range must be above zero, got {}", j["low"].dump()));
    }
    if (j.contains("grid_points")) {
      p.gridPoints = static_cast<int>(integer(j["grid_points"], at + ".grid_points", 2, 1000));
    }
  } else {
    fail(at + ".type", fmt::format("'{}' is not uniform, log_uniform, int or choice", type));
  }
  if (j.contains("flag")) p.flag = text(j["flag"], at + ".flag");
  return p;
}

std::string shortest(double v) {
  // The shortest decimal that reads back as v ({} in fmt is shortest round-trip).
  return fmt::format("{}", v);
}

}  // namespace

std::string_view toString(Algorithm a) {
  switch (a) {
    case Algorithm::kGrid:
      return "grid";
    case Algorithm::kRandom:
      return "random";
    case Algorithm::kTpe:
      return "tpe";
  }
  return "?";
}

Algorithm parseAlgorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::kGrid, Algorithm::kRandom, Algorithm::kTpe}) {
    if (name == toString(a)) return a;
  }
  SHOAL_THROW(InvalidArgument, "algorithm '{}': expected grid, random or tpe", name);
}

SweepConfig parseSweepConfig(std::string_view input) {
  if (input.size() > kMaxConfigBytes) {
    SHOAL_THROW(InvalidArgument, "sweep config: larger than {} bytes", kMaxConfigBytes);
  }
  Json j;
  try {
    j = Json::parse(input);
  } catch (const Json::exception& e) {
    SHOAL_THROW(InvalidArgument, "sweep config: not JSON: {}", e.what());
  }
  if (!j.is_object()) SHOAL_THROW(InvalidArgument, "sweep config: expected a JSON object");
  checkKeys(j, "",
            {"command", "parameters", "metric", "direction", "trials", "parallel",
             "ranks_per_trial", "launcher", "trial_time_limit", "time_limit", "grace", "algorithm",
             "seed", "early_stopping", "tpe", "env"});
  SweepConfig c;
  if (!j.contains("command")) fail("command", "missing (the program and its arguments, a list)");
  if (!j["command"].is_array() || j["command"].empty()) {
    fail("command", "expected a non-empty list of strings");
  }
  for (const Json& w : j["command"]) c.command.push_back(text(w, "command"));
  if (c.command.front().empty()) fail("command", "the program is empty");

  if (!j.contains("parameters")) fail("parameters", "missing");
  if (!j["parameters"].is_object() || j["parameters"].empty()) {
    fail("parameters", "expected a non-empty object of parameters");
  }
  if (j["parameters"].size() > kMaxParameters) fail("parameters", "more than 64");
  for (const auto& [name, spec] : j["parameters"].items()) {
    c.parameters.push_back(parseParameter(name, spec));
  }

  if (!j.contains("metric")) fail("metric", "missing (the name in the metrics file's lines)");
  c.metric = text(j["metric"], "metric");
  if (!isName(c.metric)) fail("metric", "expected a name (letters, digits, '_', '-', '.')");
  if (j.contains("direction")) {
    const std::string d = text(j["direction"], "direction");
    if (d == "max") {
      c.direction = Direction::kMaximize;
    } else if (d == "min") {
      c.direction = Direction::kMinimize;
    } else {
      fail("direction", fmt::format("'{}' is not max or min", d));
    }
  }
  if (j.contains("trials"))
    c.trials = static_cast<int>(integer(j["trials"], "trials", 1, kMaxTrials));
  if (j.contains("parallel")) {
    c.parallel = static_cast<int>(integer(j["parallel"], "parallel", 1, 1024));
  }
  if (j.contains("ranks_per_trial")) {
    c.ranksPerTrial = static_cast<int>(integer(j["ranks_per_trial"], "ranks_per_trial", 1, 4096));
  }
  if (j.contains("launcher")) {
    const std::string l = text(j["launcher"], "launcher");
    if (l != "shoal" && l != "direct")
      fail("launcher", fmt::format("'{}' is not shoal or direct", l));
    c.viaLauncher = l == "shoal";
    if (!c.viaLauncher && c.ranksPerTrial != 1) {
      fail("launcher", "direct starts one process: ranks_per_trial must be 1");
    }
  }
  if (j.contains("trial_time_limit")) {
    const double s = number(j["trial_time_limit"], "trial_time_limit");
    if (s < 0 || s > kMaxSeconds) {
      fail("trial_time_limit",
           fmt::format("expected seconds in [0, {}] (0: no limit)", kMaxSeconds));
    }
    c.trialTimeLimit = s == 0 ? std::nullopt : std::optional<double>(s);
  }
  if (j.contains("time_limit")) c.timeLimit = seconds(j["time_limit"], "time_limit");
  if (j.contains("grace")) {
    c.graceSeconds = number(j["grace"], "grace");
    if (c.graceSeconds < 0 || c.graceSeconds > 3600) fail("grace", "expected seconds in [0, 3600]");
  }
  if (j.contains("algorithm")) c.algorithm = parseAlgorithm(text(j["algorithm"], "algorithm"));
  if (j.contains("seed")) {
    c.seed = static_cast<uint64_t>(integer(j["seed"], "seed", 0, int64_t{1} << 52));
  }
  if (j.contains("early_stopping")) {
    const Json& e = j["early_stopping"];
    if (!e.is_object()) fail("early_stopping", "expected an object like {\"type\": \"asha\"}");
    checkKeys(e, "early_stopping", {"type", "min_epochs", "reduction_factor", "max_epochs"});
    const std::string type =
        e.contains("type") ? text(e["type"], "early_stopping.type") : std::string("asha");
    if (type != "asha" && type != "none") {
      fail("early_stopping.type", fmt::format("'{}' is not asha or none", type));
    }
    c.earlyStopping.enabled = type == "asha";
    if (e.contains("min_epochs")) {
      c.earlyStopping.minEpochs =
          static_cast<int>(integer(e["min_epochs"], "early_stopping.min_epochs", 1, 1 << 20));
    }
    if (e.contains("reduction_factor")) {
      c.earlyStopping.reductionFactor = static_cast<int>(
          integer(e["reduction_factor"], "early_stopping.reduction_factor", 2, 100));
    }
    if (c.earlyStopping.enabled && !e.contains("max_epochs")) {
      fail("early_stopping.max_epochs", "missing (the epochs a full trial runs: no rung there)");
    }
    if (e.contains("max_epochs")) {
      c.earlyStopping.maxEpochs =
          static_cast<int>(integer(e["max_epochs"], "early_stopping.max_epochs", 1, 1 << 20));
      if (c.earlyStopping.maxEpochs <= c.earlyStopping.minEpochs) {
        fail("early_stopping.max_epochs", "must be above min_epochs");
      }
    }
  }
  if (j.contains("tpe")) {
    const Json& t = j["tpe"];
    if (!t.is_object()) fail("tpe", "expected an object");
    checkKeys(t, "tpe", {"startup_trials", "candidates", "gamma", "multivariate"});
    if (t.contains("startup_trials")) {
      c.tpe.startupTrials =
          static_cast<int>(integer(t["startup_trials"], "tpe.startup_trials", 1, 100000));
    }
    if (t.contains("candidates")) {
      c.tpe.candidates = static_cast<int>(integer(t["candidates"], "tpe.candidates", 1, 10000));
    }
    if (t.contains("gamma")) {
      c.tpe.gamma = number(t["gamma"], "tpe.gamma");
      if (!(c.tpe.gamma > 0 && c.tpe.gamma < 1)) fail("tpe.gamma", "expected a fraction in (0, 1)");
    }
    if (t.contains("multivariate")) {
      if (!t["multivariate"].is_boolean()) fail("tpe.multivariate", "expected true or false");
      c.tpe.multivariate = t["multivariate"].get<bool>();
    }
  }
  if (j.contains("env")) {
    if (!j["env"].is_object()) fail("env", "expected an object of NAME: \"value\"");
    for (const auto& [name, value] : j["env"].items()) {
      if (name.empty() || name.find('=') != std::string::npos) {
        fail("env", fmt::format("'{}' is not a variable name", name));
      }
      c.env.emplace_back(name, text(value, "env." + name));
    }
  }
  return c;
}

std::string readSweepConfigText(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    SHOAL_THROW(InvalidArgument, "sweep config {}: not a readable file", path);
  }
  if (std::filesystem::file_size(path, ec) > kMaxConfigBytes || ec) {
    SHOAL_THROW(InvalidArgument, "sweep config {}: larger than {} bytes", path, kMaxConfigBytes);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in) SHOAL_THROW(InvalidArgument, "sweep config {}: cannot be read", path);
  return s.str();
}

bool isBetter(Direction direction, double a, double b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return direction == Direction::kMaximize ? a > b : a < b;
}

std::string formatParameter(const Parameter& p, double value) {
  switch (p.kind) {
    case ParamKind::kChoice: {
      const Json v = Json::parse(p.choices.at(static_cast<size_t>(value)));
      return v.is_string() ? v.get<std::string>() : v.dump();
    }
    case ParamKind::kInt:
      return fmt::format("{}", static_cast<int64_t>(std::llround(value)));
    default:
      return shortest(value);
  }
}

std::string displayParameter(const Parameter& p, double value) {
  if (p.kind == ParamKind::kUniform || p.kind == ParamKind::kLogUniform) {
    return fmt::format("{:.6g}", value);
  }
  return formatParameter(p, value);
}

std::string parameterJson(const Parameter& p, double value) {
  if (p.kind == ParamKind::kChoice) return p.choices.at(static_cast<size_t>(value));
  return formatParameter(p, value);
}

std::optional<double> parseParameterJson(const Parameter& p, std::string_view text) {
  Json v;
  try {
    v = Json::parse(text);
  } catch (const Json::exception&) {
    return std::nullopt;
  }
  if (p.kind == ParamKind::kChoice) {
    const std::string canonical = v.dump();
    for (size_t i = 0; i < p.choices.size(); ++i) {
      if (p.choices[i] == canonical) return static_cast<double>(i);
    }
    return std::nullopt;
  }
  if (!v.is_number()) return std::nullopt;
  const double d = v.get<double>();
  if (!(d >= p.low && d <= p.high)) return std::nullopt;
  if (p.kind == ParamKind::kInt && std::floor(d) != d) return std::nullopt;
  return d;
}

bool fits(const SweepConfig& config, const Assignment& a) {
  if (a.size() != config.parameters.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Parameter& p = config.parameters[i];
    const double v = a[i];
    if (p.kind == ParamKind::kChoice) {
      if (!(v >= 0 && v < static_cast<double>(p.choices.size())) || std::floor(v) != v)
        return false;
    } else if (!(v >= p.low && v <= p.high) || (p.kind == ParamKind::kInt && std::floor(v) != v)) {
      return false;
    }
  }
  return true;
}

std::vector<std::string> trialCommand(const SweepConfig& config, const Assignment& a, int trial,
                                      const std::string& trialDir, const std::string& metricsFile) {
  SHOAL_CHECK(fits(config, a), "trial {}: an assignment outside the search space", trial);
  std::vector<std::pair<std::string, std::string>> values = {
      {"{metrics}", metricsFile}, {"{trial}", std::to_string(trial)}, {"{trial_dir}", trialDir}};
  for (size_t i = 0; i < a.size(); ++i) {
    values.emplace_back("{" + config.parameters[i].name + "}",
                        formatParameter(config.parameters[i], a[i]));
  }
  std::vector<bool> used(values.size(), false);
  std::vector<std::string> argv;
  for (std::string word : config.command) {
    for (size_t k = 0; k < values.size(); ++k) {
      for (size_t at = word.find(values[k].first); at != std::string::npos;
           at = word.find(values[k].first, at + values[k].second.size())) {
        word.replace(at, values[k].first.size(), values[k].second);
        used[k] = true;
      }
    }
    argv.push_back(std::move(word));
  }
  if (!used[0]) {
    argv.push_back("--metrics");
    argv.push_back(metricsFile);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const Parameter& p = config.parameters[i];
    if (used[3 + i] || p.flag.empty()) continue;
    argv.push_back(p.flag);
    argv.push_back(values[3 + i].second);
  }
  return argv;
}

std::pair<double, double> internalRange(const Parameter& p) {
  if (p.kind == ParamKind::kChoice) return {0, static_cast<double>(p.choices.size())};
  const double widen = p.kind == ParamKind::kInt ? 0.5 : 0;
  if (p.log) return {std::log(p.low - widen), std::log(p.high + widen)};
  return {p.low - widen, p.high + widen};
}

double toInternal(const Parameter& p, double value) {
  return p.log ? std::log(value) : value;
}

double fromInternal(const Parameter& p, double x) {
  double v = p.log ? std::exp(x) : x;
  if (p.kind == ParamKind::kInt) v = std::round(v);
  if (p.kind == ParamKind::kChoice) {
    v = std::floor(x);
    return std::clamp(v, 0.0, static_cast<double>(p.choices.size() - 1));
  }
  return std::clamp(v, p.low, p.high);
}

}  // namespace shoal::run::sweep
