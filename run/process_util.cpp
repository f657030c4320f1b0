#include "run/process_util.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace shoal::run {

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string findProgram(const std::string& name) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    return executable(name) ? std::filesystem::absolute(name).string() : "";
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(p)) return p;
  }
  return "";
}

std::vector<std::string> environmentWithout(const std::vector<std::string>& drop) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    const std::string name = kv.substr(0, kv.find('='));
    if (std::find(drop.begin(), drop.end(), name) == drop.end()) out.push_back(std::move(kv));
  }
  return out;
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

std::string describeRankStatus(int status, bool local) {
  std::string s = describeStatus(status);
  if (!local && WIFEXITED(status) && WEXITSTATUS(status) > 128 && WEXITSTATUS(status) < 128 + 65) {
    const int sig = WEXITSTATUS(status) - 128;
    s += fmt::format(" (on its host: killed by signal {} ({}))", sig, strsignal(sig));
  }
  return s;
}

int exitCodeOf(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string remoteRankScript(const std::string& cwd, const std::vector<std::string>& assignments,
                             const std::vector<std::string>& command, double graceSeconds) {
  std::string assign, cmd;
  for (auto& a : assignments) assign += fmt::format(" {}", shellQuote(a));
  for (auto& c : command) cmd += fmt::format(" {}", shellQuote(c));
  // The watcher reads a copy of stdin (fd 3): a background job's own stdin is /dev/null.
  return fmt::format(
      "cd {} 2>/dev/null; IFS= read -r SHOAL_SECRET; export SHOAL_SECRET; exec 3<&0; "
      "env{}{} </dev/null & pid=$!; "
      "{{ cat <&3 >/dev/null; kill -TERM $pid; sleep {}; kill -KILL $pid; }} "
      ">/dev/null 2>&1 & watch=$!; exec 3<&-; "
      "wait $pid; rc=$?; kill $watch 2>/dev/null; exit $rc",
      shellQuote(cwd), assign, cmd, static_cast<int>(graceSeconds + 0.999));
}

}  // namespace shoal::run
