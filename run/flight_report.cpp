#include "run/flight_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>

#include "common/error.h"

namespace shoal::run {

namespace {

// One group of one generation: a group label is reused by the next world's group.
using GroupKey = std::pair<uint64_t, std::string>;
// A group's numbered entries: rank -> sequence number -> entry.
using Lineup = std::map<int, std::map<uint64_t, const FlightRecord*>>;

struct Finding {
  GroupKey key;
  uint64_t seq = 0;
  int64_t startNs = std::numeric_limits<int64_t>::max();  // when the disagreement began
  std::string line;
  std::vector<int> culprits;
};

// Point-to-point run in issue order is not numbered (its sequence number is always 0).
bool numbered(const FlightRecord& r) {
  return r.op != "send" && r.op != "recv";
}

std::string kindOf(const FlightRecord& r) {
  return fmt::format("{} ({} bytes)", r.op, r.bytes);
}

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

std::string groupName(const GroupKey& key) {
  return fmt::format("group {} (generation {})", key.second, key.first);
}

std::string durationText(int64_t ns) {
  if (ns < 1'000'000) return fmt::format("{:.1f} us", static_cast<double>(ns) / 1e3);
  if (ns < 1'000'000'000) return fmt::format("{:.1f} ms", static_cast<double>(ns) / 1e6);
  return fmt::format("{:.2f} s", static_cast<double>(ns) / 1e9);
}

// Of two sides of a disagreement, the smaller is taken for the odd one out (ties: `b`).
std::vector<int> minority(const std::vector<int>& a, const std::vector<int>& b) {
  return a.size() < b.size() ? a : b;
}

// The last entry of `rank` in the group before `seq`, described, or that there is none.
std::string lastBefore(const Lineup& lineup, int rank, uint64_t seq) {
  const auto& entries = lineup.at(rank);
  auto it = entries.lower_bound(seq);
  if (it == entries.begin()) return "no earlier operation in this group";
  --it;
  return fmt::format("its last was seq {} {}, {}", it->first, kindOf(*it->second),
                     toString(it->second->state));
}

// The first disagreement in one group, if any.
std::optional<Finding> firstDisagreement(const GroupKey& key, const Lineup& lineup) {
  uint64_t lo = 0, hi = 0;
  for (const auto& [rank, entries] : lineup) {
    lo = std::max(lo, entries.begin()->first);
    hi = std::max(hi, entries.rbegin()->first);
  }
  for (uint64_t s = lo; s <= hi; ++s) {
    Finding f{.key = key, .seq = s};
    std::vector<int> present, absent;
    std::map<std::string, std::vector<int>> kinds;
    for (const auto& [rank, entries] : lineup) {
      auto it = entries.find(s);
      if (it == entries.end()) {
        absent.push_back(rank);
        continue;
      }
      present.push_back(rank);
      kinds[kindOf(*it->second)].push_back(rank);
      f.startNs = std::min(f.startNs, it->second->startNs);
    }
    const FlightRecord& first = *lineup.at(present.front()).at(s);
    if (!absent.empty()) {
      f.culprits = minority(present, absent);
      f.line = fmt::format("{} seq {} {}: {} started it; {} never did", groupName(key), s,
                           kindOf(first), rankList(present), rankList(absent));
      for (int r : absent) f.line += fmt::format(" (rank {}: {})", r, lastBefore(lineup, r, s));
      return f;
    }
    if (kinds.size() > 1) {
      const auto majority = std::max_element(kinds.begin(), kinds.end(), [](auto& a, auto& b) {
        return a.second.size() < b.second.size();
      });
      f.line = fmt::format("{} seq {}:", groupName(key), s);
      for (const auto& [kind, ranks] : kinds) {
        if (&kind == &majority->first) continue;
        f.culprits.insert(f.culprits.end(), ranks.begin(), ranks.end());
        f.line += fmt::format(" {} ran {} where {} ran {}", rankList(ranks), kind,
                              rankList(majority->second), majority->first);
        // Where the odd ranks' operation is the others' next one, they skipped this one.
        const auto& next = lineup.at(majority->second.front());
        if (auto it = next.find(s + 1); it != next.end() && kindOf(*it->second) == kind) {
          f.line += fmt::format(" ({} skipped the others' seq {}: {} seq {} is the others' {})",
                                ranks.size() == 1 ? "it" : "they", s,
                                ranks.size() == 1 ? "its" : "their", s, s + 1);
        }
        f.line += ";";
      }
      f.line.pop_back();
      std::sort(f.culprits.begin(), f.culprits.end());
      return f;
    }
    std::vector<int> unfinished, failed;
    const FlightRecord* firstFailure = nullptr;
    int firstFailedRank = -1;
    for (int r : present) {
      const FlightRecord& e = *lineup.at(r).at(s);
      if (e.state == FlightState::kCompleted) continue;
      unfinished.push_back(r);
      if (e.state != FlightState::kFailed) continue;
      failed.push_back(r);
      if (firstFailure == nullptr || e.endNs < firstFailure->endNs) {
        firstFailure = &e;
        firstFailedRank = r;
      }
    }
    if (unfinished.empty()) continue;
    f.line = fmt::format("{} seq {} {} did not complete on {}", groupName(key), s, kindOf(first),
                         rankList(unfinished));
    if (firstFailure != nullptr) {
      f.culprits = {firstFailedRank};
      f.line +=
          fmt::format(": it failed first on rank {}: {}", firstFailedRank, firstFailure->detail);
    } else {
      f.culprits = unfinished;
      f.line += ": still running there";
    }
    return f;
  }
  return std::nullopt;
}

std::string processState(const FlightFile& f) {
  if (f.closedNs != 0) return "ended cleanly";
  return "did not close its recorder: killed, crashed or still running";
}

std::string lastOperation(const FlightFile& f) {
  if (f.entries.empty()) return "no operation noted";
  const FlightRecord& e = f.entries.back();
  std::string line = fmt::format("last: {} ", groupName({e.generation, e.group}));
  line += numbered(e) ? fmt::format("seq {} {}", e.seq, kindOf(e))
                      : fmt::format("{} (peer {}, {} bytes)", e.op, e.peer, e.bytes);
  if (e.state == FlightState::kRunning) {
    line += ", running";
  } else {
    line += fmt::format(", {} after {}", toString(e.state), durationText(e.endNs - e.startNs));
    if (e.state == FlightState::kFailed) line += ": " + e.detail;
  }
  return line;
}

}  // namespace

std::vector<std::string> flightFiles(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "flight recorder: cannot list '{}': {}", dir, ec.message());
  std::vector<std::pair<int, std::string>> found;
  const std::string prefix = "flight.rank";
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    int rank = -1;
    const char* begin = name.data() + prefix.size();
    const char* end = name.data() + name.size();
    auto [ptr, err] = std::from_chars(begin, end, rank);
    if (err != std::errc() || ptr != end || begin == end || rank < 0) continue;
    found.emplace_back(rank, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [rank, path] : found) paths.push_back(std::move(path));
  return paths;
}

FlightDiagnosis diagnoseFlight(const std::vector<std::string>& files, int expectedRanks) {
  FlightDiagnosis d;
  for (const auto& path : files) d.files.push_back(readFlightFile(path));
  std::sort(d.files.begin(), d.files.end(),
            [](const FlightFile& a, const FlightFile& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < d.files.size(); ++i) {
    if (d.files[i].rank == d.files[i - 1].rank) {
      SHOAL_THROW(InvalidArgument, "flight recorder: {} and {} both claim rank {}",
                  d.files[i - 1].path, d.files[i].path, d.files[i].rank);
    }
  }
  for (int r = 0; r < expectedRanks; ++r) {
    const bool has = std::any_of(d.files.begin(), d.files.end(),
                                 [r](const FlightFile& f) { return f.rank == r; });
    if (!has) d.missingRanks.push_back(r);
  }
  std::map<GroupKey, Lineup> groups;
  for (const auto& f : d.files) {
    for (const auto& e : f.entries) {
      if (numbered(e)) groups[{e.generation, e.group}][f.rank][e.seq] = &e;
    }
  }
  std::optional<Finding> first;
  for (const auto& [key, lineup] : groups) {
    auto found = firstDisagreement(key, lineup);
    if (found && (!first || found->startNs < first->startNs)) first = std::move(found);
  }
  if (first) {
    d.desync = std::move(first->line);
    d.group = first->key.second;
    d.seq = first->seq;
    d.culprits = std::move(first->culprits);
  }
  return d;
}

FlightDiagnosis diagnoseFlightDir(const std::string& dir, int expectedRanks) {
  auto files = flightFiles(dir);
  if (files.empty()) {
    SHOAL_THROW(InvalidArgument, "flight recorder: no flight.rank<R> files in '{}'", dir);
  }
  return diagnoseFlight(files, expectedRanks);
}

std::string describe(const FlightDiagnosis& d) {
  std::string out = d.desync.empty()
                        ? "no desynchronised operation: every group's operations agree on the "
                          "ranks that noted them\n"
                        : "first desynchronised operation: " + d.desync + "\n";
  for (const auto& f : d.files) {
    out += fmt::format("  rank {} (host {}, pid {}, {}", f.rank, f.host, f.pid, processState(f));
    if (f.begun > f.entries.size()) out += fmt::format("; {} operations noted", f.begun);
    if (f.torn > 0) out += fmt::format("; {} torn entries skipped", f.torn);
    out += "): " + lastOperation(f) + "\n";
  }
  if (!d.missingRanks.empty()) {
    out += fmt::format("  no flight recorder file from {}\n", rankList(d.missingRanks));
  }
  return out;
}

}  // namespace shoal::run
