#include "run/run_directory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/trace_file.h"
#include "common/wall_clock.h"
#include "run/launcher.h"
#include "run/process_util.h"
#include "run/run_configuration.h"

namespace shoal::run {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxRecordBytes = 1 << 20;
// .git files (HEAD, a ref, packed-refs) are small; anything larger is not one.
constexpr uint64_t kMaxGitFileBytes = 16 << 20;

// The file's text, or nullopt if it is missing, not a regular file, or over `limit`.
std::optional<std::string> readSmallFile(const fs::path& path, uint64_t limit) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > limit || ec) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string firstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

bool isRevision(const std::string& s) {
  return (s.size() == 40 || s.size() == 64) &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c) != 0; });
}

// The repository's git folder for a work tree at `top` (.git is a folder, or a file naming it).
std::optional<fs::path> gitDirAt(const fs::path& top) {
  const fs::path dotGit = top / ".git";
  std::error_code ec;
  if (fs::is_directory(dotGit, ec)) return dotGit;
  auto text = readSmallFile(dotGit, 4096);
  if (!text || text->rfind("gitdir: ", 0) != 0) return std::nullopt;
  fs::path dir = firstLine(text->substr(8));
  return dir.is_absolute() ? dir : top / dir;
}

}  // namespace

std::string metricsPath(const std::string& dir) {
  return dir + "/metrics.db";
}

std::optional<std::string> runDirectoryFromEnv() {
  // A launcher variable like SHOAL_RANK (README "Configuration"): read here, by the one
  // function that needs it, so that the rank side's other headers stay as they are.
  const char* dir = std::getenv("SHOAL_RUN_DIR");
  if (dir == nullptr) return std::nullopt;
  if (*dir == '\0') SHOAL_THROW(InvalidArgument, "SHOAL_RUN_DIR is set but empty");
  return std::string(dir);
}

std::optional<std::string> gitRevision(const std::string& dir) {
  std::error_code ec;
  fs::path at = fs::absolute(dir, ec);
  if (ec) return std::nullopt;
  std::optional<fs::path> gitDir;
  for (int depth = 0; depth < 256 && !gitDir; ++depth) {
    gitDir = gitDirAt(at);
    if (gitDir || at == at.root_path()) break;
    at = at.parent_path();
  }
  if (!gitDir) return std::nullopt;
  auto head = readSmallFile(*gitDir / "HEAD", 4096);
  if (!head) return std::nullopt;
  const std::string line = firstLine(*head);
  if (isRevision(line)) return line;  // a detached HEAD
  if (line.rfind("ref: ", 0) != 0) return std::nullopt;
  const std::string ref = line.substr(5);
  if (ref.find("..") != std::string::npos) return std::nullopt;
  // A linked work tree keeps its refs in the main repository (commondir).
  fs::path common = *gitDir;
  if (auto c = readSmallFile(*gitDir / "commondir", 4096)) {
    fs::path p = firstLine(*c);
    common = p.is_absolute() ? p : *gitDir / p;
  }
  for (const fs::path& base : {*gitDir, common}) {
    if (auto r = readSmallFile(base / ref, 4096); r && isRevision(firstLine(*r))) {
      return firstLine(*r);
    }
  }
  if (auto packed = readSmallFile(common / "packed-refs", kMaxGitFileBytes)) {
    std::istringstream lines(*packed);
    std::string l;
    while (std::getline(lines, l)) {
      const auto space = l.find(' ');
      if (space != std::string::npos && l.substr(space + 1) == ref &&
          isRevision(l.substr(0, space))) {
        return l.substr(0, space);
      }
    }
  }
  return std::nullopt;
}

json toJson(const RunRecord& r) {
  return {{"shoal_run", 1},
          {"name", r.name},
          {"command", r.command},
          {"working_directory", r.workingDirectory},
          {"git_revision", r.gitRevision ? json(*r.gitRevision) : json(nullptr)},
          {"hosts", r.hosts},
          {"ranks", r.ranks},
          {"servers", r.servers},
          {"elastic", r.elastic ? json(*r.elastic) : json(nullptr)},
          {"started_ns", r.startedNs},
          {"ended_ns", r.endedNs},
          {"status", r.status},
          {"exit_code", r.exitCode ? json(*r.exitCode) : json(nullptr)},
          {"attempts", r.attempts},
          {"configuration", r.configuration}};
}

void writeRunRecord(const std::string& dir, const RunRecord& r) {
  writeFileAtomically(dir + "/run.json", toJson(r).dump(2) + "\n");
}

RunRecord readRunRecord(const std::string& dir) {
  const std::string path = dir + "/run.json";
  auto text = readSmallFile(path, kMaxRecordBytes);
  if (!text) {
    SHOAL_THROW(InvalidArgument, "run record {}: missing, not a regular file, or over {} bytes",
                path, kMaxRecordBytes);
  }
  RunRecord r;
  try {
    const json j = json::parse(*text);
    if (!j.is_object() || j.value("shoal_run", 0) != 1) {
      SHOAL_THROW(InvalidArgument, "not a Shoal run record (no \"shoal_run\": 1)");
    }
    r.name = j.at("name").get<std::string>();
    r.command = j.at("command").get<std::vector<std::string>>();
    r.workingDirectory = j.at("working_directory").get<std::string>();
    if (!j.at("git_revision").is_null()) r.gitRevision = j.at("git_revision").get<std::string>();
    r.hosts = j.at("hosts").get<std::vector<std::string>>();
    r.ranks = j.at("ranks").get<int>();
    r.servers = j.at("servers").get<int>();
    if (!j.at("elastic").is_null()) r.elastic = j.at("elastic").get<std::string>();
    r.startedNs = j.at("started_ns").get<int64_t>();
    r.endedNs = j.at("ended_ns").get<int64_t>();
    r.status = j.at("status").get<std::string>();
    if (r.status != "running" && r.status != "succeeded" && r.status != "failed") {
      SHOAL_THROW(InvalidArgument, "status '{}' (running, succeeded, failed)", r.status);
    }
    if (!j.at("exit_code").is_null()) r.exitCode = j.at("exit_code").get<int>();
    r.attempts = j.at("attempts").get<int>();
    // Optional: records from before it have none.
    r.configuration = j.value("configuration", json(nullptr));
    if (!r.configuration.is_null() && !r.configuration.is_object()) {
      SHOAL_THROW(InvalidArgument, "configuration: expected an object, got {}",
                  r.configuration.type_name());
    }
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "run record {}: {}", path, e.what());
  } catch (const std::exception& e) {
    // nlohmann's messages are one line: a parse error's position, a missing key, a wrong type.
    SHOAL_THROW(InvalidArgument, "run record {}: {}", path, e.what());
  }
  return r;
}

RunDirectory::RunDirectory(const LaunchOptions& o) {
  if (o.runDir.empty()) return;
  std::error_code ec;
  const fs::path dir = fs::absolute(o.runDir, ec);
  fs::create_directories(dir, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "--run-dir '{}': {}", o.runDir, ec.message());
  if (fs::exists(dir / "run.json", ec)) {
    SHOAL_THROW(InvalidArgument,
                "--run-dir '{}' already holds a run (run.json): give each job a new folder",
                o.runDir);
  }
  dir_ = dir.string();
  record_.name = dir.filename().string();
  record_.command = o.command;
  record_.workingDirectory = fs::current_path(ec).string();
  record_.gitRevision = gitRevision(record_.workingDirectory);
  for (const auto& h : o.hosts) record_.hosts.push_back(fmt::format("{}:{}", h.host, h.slots));
  record_.ranks = o.ranks;
  record_.servers = o.servers;
  record_.elastic = o.elastic;
  record_.startedNs = wallClockNs();
  record_.configuration = jobConfiguration(o, environmentWithout({}));
  try {
    writeRunRecord(dir_, record_);
  } catch (const std::exception& e) {
    SHOAL_THROW(InvalidArgument, "--run-dir '{}': {}", o.runDir, e.what());
  }
}

std::vector<std::pair<std::string, std::string>> RunDirectory::variables() const {
  if (!enabled()) return {};
  return {{"SHOAL_RUN_DIR", dir_}};
}

void RunDirectory::finish(int exitCode, int ranks) noexcept {
  if (!enabled()) return;
  if (ranks > 0) record_.ranks = ranks;
  record_.endedNs = wallClockNs();
  record_.status = exitCode == 0 ? "succeeded" : "failed";
  record_.exitCode = exitCode;
  try {
    writeRunRecord(dir_, record_);
  } catch (const std::exception& e) {
    const std::string line =
        fmt::format("shoal run: cannot record the end of the run: {}\n", e.what());
    [[maybe_unused]] ssize_t w = ::write(2, line.data(), line.size());
  }
}

}  // namespace shoal::run
