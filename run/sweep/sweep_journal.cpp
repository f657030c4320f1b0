#include "run/sweep/sweep_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/trace_file.h"

namespace shoal::run::sweep {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxRecordBytes = 2 << 20;

Json paramsJson(const SweepConfig& config, const Assignment& a) {
  Json j = Json::object();
  for (size_t i = 0; i < a.size(); ++i) {
    j[config.parameters[i].name] = Json::parse(parameterJson(config.parameters[i], a[i]));
  }
  return j;
}

// nullopt when a parameter is missing, extra or out of the space.
std::optional<Assignment> readParams(const SweepConfig& config, const Json& j) {
  if (!j.is_object() || j.size() != config.parameters.size()) return std::nullopt;
  Assignment a;
  for (const Parameter& p : config.parameters) {
    const auto it = j.find(p.name);
    if (it == j.end()) return std::nullopt;
    const auto v = parseParameterJson(p, it->dump());
    if (!v) return std::nullopt;
    a.push_back(*v);
  }
  return a;
}

Json number(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

std::optional<std::string> readSmall(const std::string& path, uint64_t limit, bool* tooLarge) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  if (!std::filesystem::is_regular_file(path, ec)) {
    SHOAL_THROW(InvalidArgument, "{}: not a regular file", path);
  }
  if (std::filesystem::file_size(path, ec) > limit) {
    *tooLarge = true;
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) throwSystemError(path + ": read", errno);
  return s.str();
}

}  // namespace

std::string_view toString(TrialStatus s) {
  switch (s) {
    case TrialStatus::kCompleted:
      return "completed";
    case TrialStatus::kFailed:
      return "failed";
    case TrialStatus::kPruned:
      return "pruned";
    case TrialStatus::kTimedOut:
      return "timeout";
  }
  return "?";
}

SweepJournal::SweepJournal(std::string path) : path_(std::move(path)) {
  fd_ = Fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd_.valid()) throwSystemError("sweep journal " + path_, errno);
}

void SweepJournal::append(const std::string& line) {
  // One write: with O_APPEND the line lands whole after whatever is there; a crash can only
  // tear the last line, which readJournal skips.
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throwSystemError("sweep journal " + path_ + ": write", errno);
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd_.get()) != 0)
    throwSystemError("sweep journal " + path_ + ": fdatasync", errno);
}

void SweepJournal::started(const SweepConfig& config, int trial, const Assignment& params,
                           const std::string& hosts, const std::string& slots) {
  Json j{{"event", "start"}, {"trial", trial}, {"params", paramsJson(config, params)}};
  if (!hosts.empty()) {
    j["hosts"] = hosts;
    j["slots"] = slots;
  }
  append(j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

void SweepJournal::finished(const SweepConfig& config, const TrialRecord& r) {
  Json curve = Json::array();
  for (const EpochValue& e : r.curve) curve.push_back(Json::array({e.epoch, number(e.value)}));
  Json j{{"event", "end"},
         {"trial", r.id},
         {"params", paramsJson(config, r.params)},
         {"status", toString(r.status)},
         {"metric", number(r.metric)},
         {"curve", curve},
         {"seconds", r.seconds},
         {"exit_code", r.exitCode},
         {"reason", r.reason},
         {"started_ms", r.startedMs},
         {"ended_ms", r.endedMs}};
  if (!r.hosts.empty()) {
    j["hosts"] = r.hosts;
    j["slots"] = r.slots;
  }
  append(j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

JournalContents readJournal(const std::string& path, const SweepConfig& config) {
  JournalContents out;
  bool tooLarge = false;
  const auto text = readSmall(path, kMaxJournalBytes, &tooLarge);
  if (tooLarge) {
    SHOAL_THROW(InvalidArgument, "sweep journal {}: larger than {} bytes", path, kMaxJournalBytes);
  }
  if (!text) return out;
  std::map<int, Assignment> open;
  size_t at = 0;
  while (at < text->size()) {
    const size_t end = text->find('\n', at);
    if (end == std::string::npos) {
      ++out.skippedLines;  // torn by a crash mid-write
      break;
    }
    const std::string_view line(text->data() + at, end - at);
    at = end + 1;
    if (line.size() > kMaxJournalLineBytes) {
      ++out.skippedLines;
      continue;
    }
    const Json j = Json::parse(line, nullptr, false);
    const auto skip = [&] { ++out.skippedLines; };
    if (!j.is_object() || !j.contains("event") || !j.contains("trial") ||
        !j["trial"].is_number_integer() || j["trial"].get<int64_t>() < 0 ||
        j["trial"].get<int64_t>() > (1 << 30)) {
      skip();
      continue;
    }
    const int id = static_cast<int>(j["trial"].get<int64_t>());
    const auto params = j.contains("params") ? readParams(config, j["params"]) : std::nullopt;
    if (!params) {
      skip();
      continue;
    }
    if (j["event"] == "start") {
      open[id] = *params;
      continue;
    }
    if (j["event"] != "end") {
      skip();
      continue;
    }
    TrialRecord r;
    r.id = id;
    r.params = *params;
    const std::string status = j.value("status", "");
    bool known = false;
    for (TrialStatus s : {TrialStatus::kCompleted, TrialStatus::kFailed, TrialStatus::kPruned,
                          TrialStatus::kTimedOut}) {
      if (status == toString(s)) {
        r.status = s;
        known = true;
      }
    }
    if (!known) {
      skip();
      continue;
    }
    try {
      r.metric = j["metric"].is_number() ? j["metric"].get<double>() : NAN;
      for (const Json& e : j.at("curve")) {
        const int epoch = e.at(0).get<int>();
        r.curve.push_back({epoch, e.at(1).is_number() ? e.at(1).get<double>() : NAN});
      }
      r.seconds = j.value("seconds", 0.0);
      r.exitCode = j.value("exit_code", -1);
      r.reason = j.value("reason", "");
      r.startedMs = j.value("started_ms", int64_t{0});
      r.endedMs = j.value("ended_ms", int64_t{0});
      r.hosts = j.value("hosts", "");
      r.slots = j.value("slots", "");
    } catch (const Json::exception&) {
      skip();
      continue;
    }
    open.erase(id);
    // A trial that ended twice (a rerun after a resume that itself was cut short): the last
    // end wins.
    std::erase_if(out.finished, [&](const TrialRecord& f) { return f.id == id; });
    out.finished.push_back(std::move(r));
  }
  out.interrupted = std::move(open);
  return out;
}

void writeSweepRecord(const std::string& dir, const SweepRecord& r) {
  Json j = {{"config", Json::parse(r.configJson)},
            {"algorithm", toString(r.algorithm)},
            {"seed", r.seed}};
  if (r.trialTimeLimit) j["trial_time_limit"] = *r.trialTimeLimit;
  writeFileAtomically(dir + "/sweep.json", j.dump(2) + "\n");
}

std::optional<SweepRecord> readSweepRecord(const std::string& dir) {
  const std::string path = dir + "/sweep.json";
  bool tooLarge = false;
  const auto text = readSmall(path, kMaxRecordBytes, &tooLarge);
  if (tooLarge) SHOAL_THROW(InvalidArgument, "{}: larger than {} bytes", path, kMaxRecordBytes);
  if (!text) return std::nullopt;
  const Json j = Json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object() ||
      !j.contains("algorithm") || !j["algorithm"].is_string() || !j.contains("seed") ||
      !j["seed"].is_number_unsigned()) {
    SHOAL_THROW(InvalidArgument, "{}: not a sweep record (config, algorithm, seed)", path);
  }
  SweepRecord r;
  r.configJson = j["config"].dump();
  r.algorithm = parseAlgorithm(j["algorithm"].get<std::string>());
  r.seed = j["seed"].get<uint64_t>();
  if (j.contains("trial_time_limit")) {
    const Json& t = j["trial_time_limit"];
    if (!t.is_number() || !(t.get<double>() >= 0 && t.get<double>() <= kMaxSeconds)) {
      SHOAL_THROW(InvalidArgument, "{}: trial_time_limit is not seconds in [0, {}]", path,
                  kMaxSeconds);
    }
    r.trialTimeLimit = t.get<double>();
  }
  return r;
}

bool sameSweep(const SweepRecord& a, const SweepRecord& b) {
  // The budget may change between runs (more trials, more in parallel, more time); what is
  // searched, and how, may not. Key order does not matter (nlohmann::json compares as maps).
  const auto meaning = [](const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object()) {
      for (const char* key : {"trials", "parallel", "time_limit", "trial_time_limit"}) {
        j.erase(key);
      }
    }
    return j;
  };
  return meaning(a.configJson) == meaning(b.configJson) && a.algorithm == b.algorithm &&
         a.seed == b.seed;
}

}  // namespace shoal::run::sweep
