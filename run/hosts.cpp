#include "run/hosts.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/socket.h"

namespace shoal::run {

namespace {

HostSlots parseEntry(std::string_view entry, const std::string& where) {
  std::string s(entry);
  HostSlots h;
  std::string countText;
  bool hasCount = true;
  if (auto eq = s.find(" slots="); eq != std::string::npos) {
    h.host = s.substr(0, eq);
    countText = s.substr(eq + 7);
  } else if (auto colon = s.rfind(':'); colon != std::string::npos) {
    h.host = s.substr(0, colon);
    countText = s.substr(colon + 1);
  } else {
    h.host = s;
    hasCount = false;
  }
  auto trim = [](std::string& t) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t\r") + 1);
  };
  trim(h.host);
  trim(countText);
  if (h.host.empty() || h.host.find_first_of(" \t'\"") != std::string::npos) {
    SHOAL_THROW(InvalidArgument, "{}: malformed host entry '{}'", where, s);
  }
  if (hasCount) {
    char* end = nullptr;
    long n = std::strtol(countText.c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) {
      SHOAL_THROW(InvalidArgument, "{}: host '{}': slots '{}' must be 1..4096", where, h.host,
                  countText);
    }
    h.slots = static_cast<int>(n);
  }
  return h;
}

}  // namespace

std::vector<HostSlots> parseHostList(std::string_view spec) {
  std::vector<HostSlots> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t next = spec.find(',', pos);
    if (next == std::string_view::npos) next = spec.size();
    out.push_back(parseEntry(spec.substr(pos, next - pos), "--hosts"));
    pos = next + 1;
  }
  return out;
}

std::vector<HostSlots> parseHostLines(std::string_view text, const std::string& source) {
  std::vector<HostSlots> out;
  size_t pos = 0;
  for (int n = 1; pos < text.size(); ++n) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string line(text.substr(pos, end - pos));
    pos = end + 1;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parseEntry(line, fmt::format("{}:{}", source, n)));
  }
  return out;
}

std::vector<HostSlots> readHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) SHOAL_THROW(InvalidArgument, "hostfile '{}' cannot be read", path);
  std::stringstream text;
  text << in.rdbuf();
  auto out = parseHostLines(text.str(), path);
  if (out.empty()) SHOAL_THROW(InvalidArgument, "hostfile '{}' lists no hosts", path);
  return out;
}

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || isLoopback(host)) return true;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return host == name;
}

std::vector<Placement> placeRanks(int ranks, const std::vector<HostSlots>& hosts) {
  if (hosts.empty()) {
    SHOAL_CHECK(ranks >= 1, "-n must be at least 1, got {}", ranks);
    std::vector<Placement> out(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) out[r] = {"localhost", true, r, ranks};
    return out;
  }
  int slots = 0;
  for (auto& h : hosts) {
    if (!isLocalHost(h.host) && !resolveIPv4(h.host)) {
      SHOAL_THROW(InvalidArgument, "unknown host '{}' (it does not resolve)", h.host);
    }
    slots += h.slots;
  }
  if (ranks == 0) ranks = slots;
  if (ranks < 1) SHOAL_THROW(InvalidArgument, "-n must be at least 1, got {}", ranks);
  if (ranks > slots) {
    SHOAL_THROW(InvalidArgument, "-n {} ranks, but the hosts offer only {} slots", ranks, slots);
  }
  std::vector<Placement> out;
  std::map<std::string, int> perHost;
  for (auto& h : hosts) {
    for (int s = 0; s < h.slots && static_cast<int>(out.size()) < ranks; ++s) {
      out.push_back({h.host, isLocalHost(h.host), perHost[h.host]++, 0});
    }
  }
  for (auto& p : out) p.localSize = perHost[p.host];
  return out;
}

}  // namespace shoal::run
