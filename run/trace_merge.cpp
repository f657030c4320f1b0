#include "run/trace_merge.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/trace_file.h"

namespace shoal::run {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TooDeep {};

// One line, whatever the parser or the file put in the text.
std::string oneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

// The whole file, refused before reading if it is not a regular file or is too large (a FIFO
// or /dev/zero would otherwise be read without end).
std::string readBounded(const std::string& path, uint64_t maxBytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    SHOAL_THROW(InvalidArgument, "trace {}: cannot be read ({})", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "trace {}: not a regular file", path);
  }
  if (static_cast<uint64_t>(st.st_size) > maxBytes) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "trace {}: {} bytes, more than the limit of {}", path, st.st_size,
                maxBytes);
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shrank while read: what was read is checked as it is
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

json parseBounded(const std::string& path, const std::string& text) {
  // The parser itself does not recurse, but a document nested thousands deep is no trace and
  // would make everything that walks it slow or deep; the format needs 4 levels.
  json::parser_callback_t limitDepth = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxTraceDepth) throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text, limitDepth);
  } catch (const TooDeep&) {
    SHOAL_THROW(InvalidArgument, "trace {}: nested deeper than {} levels: not a Shoal trace", path,
                kMaxTraceDepth);
  } catch (const json::exception& e) {
    SHOAL_THROW(InvalidArgument, "trace {}: malformed JSON (truncated?): {}", path,
                oneLine(e.what()));
  }
}

struct RankMeta {
  int rank = 0;
  std::string host;
  int64_t offsetNs = 0;
  int64_t errorNs = 0;
  bool measured = true;
  uint64_t recorded = 0;
  uint64_t dropped = 0;
  uint64_t capacity = 0;
  std::vector<ClockSample> samples;  // "clock_sync"; empty in files without it
};

template <typename T>
T field(const std::string& path, const json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end()) SHOAL_THROW(InvalidArgument, "trace {}: otherData.{} is missing", path, key);
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  } else if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_unsigned_v<T>) {
    ok = it->is_number_unsigned();
  } else {
    ok = it->is_number_integer();
  }
  if (!ok) SHOAL_THROW(InvalidArgument, "trace {}: otherData.{} has the wrong type", path, key);
  return it->get<T>();
}

// otherData.clock_sync (optional: files written before it have none).
std::vector<ClockSample> samplesOf(const std::string& path, const json& other, size_t maxSamples) {
  std::vector<ClockSample> out;
  const auto it = other.find("clock_sync");
  if (it == other.end()) return out;
  if (!it->is_array()) SHOAL_THROW(InvalidArgument, "trace {}: clock_sync is not an array", path);
  if (it->size() > maxSamples) {
    SHOAL_THROW(InvalidArgument, "trace {}: {} clock measurements, more than the limit of {}", path,
                it->size(), maxSamples);
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& c = (*it)[i];
    auto number = [&](const char* key) {
      const auto v = c.is_object() ? c.find(key) : c.end();
      if (!c.is_object() || v == c.end() || !v->is_number_integer()) {
        SHOAL_THROW(InvalidArgument, "trace {}: clock_sync[{}].{} is missing or not an integer",
                    path, i, key);
      }
      return v->get<int64_t>();
    };
    out.push_back({number("at_ns"), number("offset_ns"), number("error_ns")});
  }
  return out;
}

RankMeta metaOf(const std::string& path, const json& doc, const TraceMergeOptions& options) {
  if (!doc.is_object()) SHOAL_THROW(InvalidArgument, "trace {}: not a JSON object", path);
  const auto other = doc.find("otherData");
  if (other == doc.end() || !other->is_object()) {
    SHOAL_THROW(InvalidArgument, "trace {}: no otherData object: not a Shoal rank trace", path);
  }
  const auto version = field<int64_t>(path, *other, "shoal_trace");
  if (version != kTraceFormatVersion) {
    SHOAL_THROW(InvalidArgument, "trace {}: format version {}, expected {}", path, version,
                kTraceFormatVersion);
  }
  RankMeta m;
  const int64_t rank = field<int64_t>(path, *other, "rank");
  if (rank < 0 || rank > (int64_t{1} << 24)) {
    SHOAL_THROW(InvalidArgument, "trace {}: rank {} out of range", path, rank);
  }
  m.rank = static_cast<int>(rank);
  m.host = field<std::string>(path, *other, "host");
  m.offsetNs = field<int64_t>(path, *other, "clock_offset_ns");
  m.errorNs = field<int64_t>(path, *other, "clock_error_ns");
  if (m.errorNs < 0) SHOAL_THROW(InvalidArgument, "trace {}: negative clock_error_ns", path);
  m.measured = field<bool>(path, *other, "clock_measured");
  m.recorded = field<uint64_t>(path, *other, "recorded");
  m.dropped = field<uint64_t>(path, *other, "dropped");
  m.capacity = field<uint64_t>(path, *other, "capacity");
  m.samples = samplesOf(path, *other, options.maxClockSamples);
  const auto events = doc.find("traceEvents");
  if (events == doc.end() || !events->is_array()) {
    SHOAL_THROW(InvalidArgument, "trace {}: no traceEvents array", path);
  }
  return m;
}

void checkEvent(const std::string& path, const json& e, size_t index, int rank) {
  if (!e.is_object())
    SHOAL_THROW(InvalidArgument, "trace {}: event {} is not an object", path, index);
  const auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string()) {
    SHOAL_THROW(InvalidArgument, "trace {}: event {} has no phase (ph)", path, index);
  }
  const auto pid = e.find("pid");
  if (pid == e.end() || !pid->is_number_integer() || pid->get<int64_t>() != rank) {
    SHOAL_THROW(InvalidArgument, "trace {}: event {} does not belong to rank {} (pid)", path, index,
                rank);
  }
  const auto ts = e.find("ts");
  if (ts != e.end() && (!ts->is_number() || !std::isfinite(ts->get<double>()))) {
    SHOAL_THROW(InvalidArgument, "trace {}: event {} has a bad timestamp", path, index);
  }
}

// Note [Aligning a rank's times]: a rank file's times are its sink's clock shifted by the
// offset measured at start-up (clock_offset_ns). Where the file lists its measurements
// (clock_sync), each time is taken back to the sink's clock and shifted instead by the offset
// interpolated between the measurements around it (common/clock_map.h): a complete event's end
// as well as its begin, so its duration follows the drift too. The rank's error is the largest
// bound among the measurements some time was mapped with. A file without measurements is
// copied as it is, with its one offset's bound.
class Aligner {
 public:
  Aligner(const std::string& path, const RankMeta& m)
      : path_(path), base_(m.offsetNs), fallback_(m.errorNs) {
    try {
      map_.emplace(m.samples);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "trace {}: {}", path, e.what());
    }
  }

  // The event with its times on rank 0's clock (a copy only where it changes).
  const json& align(const json& e, json& scratch) {
    if (map_->samples().empty()) return e;
    const auto ts = e.find("ts");
    if (ts == e.end()) return e;
    scratch = e;
    const double begin = ts->get<double>() * 1e3 - static_cast<double>(base_);
    const double mapped = toReference(begin);
    scratch["ts"] = mapped / 1e3;
    const auto dur = e.find("dur");
    if (dur != e.end() && dur->is_number() && std::isfinite(dur->get<double>())) {
      const double end = toReference(begin + dur->get<double>() * 1e3);
      scratch["dur"] = std::max(0.0, end - mapped) / 1e3;
    }
    return scratch;
  }

  // The largest error bound among the measurements used (none used: the start-up one's).
  int64_t errorNs() const { return used_ ? error_ : fallback_; }

 private:
  double toReference(double localNs) {
    int64_t error = 0;
    const double mapped = localNs + map_->offsetAt(localNs, &error);
    // Finite inputs can still add up to infinity in a crafted file.
    if (!std::isfinite(mapped)) {
      SHOAL_THROW(InvalidArgument, "trace {}: a time out of range once aligned", path_);
    }
    error_ = std::max(error_, error);
    used_ = true;
    return mapped;
  }

  std::string path_;
  int64_t base_;
  int64_t fallback_;
  std::optional<ClockMap> map_;
  bool used_ = false;
  int64_t error_ = 0;
};

class Output {
 public:
  explicit Output(const std::string& path)
      : path_(path), tmp_(fmt::format("{}.tmp.{}", path, ::getpid())) {
    file_ = std::fopen(tmp_.c_str(), "w");
    if (file_ == nullptr) throwSystemError("trace: open " + tmp_, errno);
  }
  ~Output() {
    if (file_ != nullptr) {
      std::fclose(file_);
      std::remove(tmp_.c_str());
    }
  }
  void put(std::string_view s) {
    if (std::fwrite(s.data(), 1, s.size(), file_) != s.size()) {
      throwSystemError("trace: write " + tmp_, errno);
    }
  }
  void commit() {
    const bool ok = std::fflush(file_) == 0;
    const int err = errno;
    std::fclose(file_);
    file_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = ok ? errno : err;
      std::remove(tmp_.c_str());
      throwSystemError(fmt::format("trace: writing {}", path_), e);
    }
  }

 private:
  std::string path_;
  std::string tmp_;
  std::FILE* file_ = nullptr;
};

}  // namespace

TraceMergeSummary mergeTraces(const std::vector<std::string>& rankFiles, const std::string& outPath,
                              const TraceMergeOptions& options) {
  if (rankFiles.empty()) SHOAL_THROW(InvalidArgument, "trace merge: no rank files to merge");
  Output out(outPath);
  TraceMergeSummary summary;
  std::map<int, std::pair<RankMeta, std::string>> ranks;  // rank -> (metadata, file)
  out.put("{\"traceEvents\":[");
  bool first = true;
  auto put = [&](const json& e) {
    out.put(first ? "\n" : ",\n");
    first = false;
    out.put(e.dump(-1, ' ', false, json::error_handler_t::replace));
  };
  // One file's document at a time: its events go out before the next file is read.
  for (const std::string& path : rankFiles) {
    const json doc = parseBounded(path, readBounded(path, options.maxFileBytes));
    RankMeta meta = metaOf(path, doc, options);
    if (auto it = ranks.find(meta.rank); it != ranks.end()) {
      SHOAL_THROW(InvalidArgument, "trace {}: rank {} also has {}", path, meta.rank,
                  it->second.second);
    }
    const json& events = doc["traceEvents"];
    for (size_t i = 0; i < events.size(); ++i) checkEvent(path, events[i], i, meta.rank);
    Aligner aligner(path, meta);
    put({{"name", "process_name"},
         {"ph", "M"},
         {"pid", meta.rank},
         {"args", {{"name", fmt::format("rank {} ({})", meta.rank, meta.host)}}}});
    put({{"name", "process_sort_index"},
         {"ph", "M"},
         {"pid", meta.rank},
         {"args", {{"sort_index", meta.rank}}}});
    json scratch;
    for (const json& e : events) put(aligner.align(e, scratch));
    summary.events += events.size();
    meta.errorNs = aligner.errorNs();
    summary.alignmentErrorNs = std::max(summary.alignmentErrorNs, meta.errorNs);
    summary.dropped += meta.dropped;
    ranks.emplace(meta.rank, std::make_pair(std::move(meta), path));
  }
  summary.ranks = static_cast<int>(ranks.size());
  const int span = std::max(options.expectedRanks, ranks.rbegin()->first + 1);
  json rankList = json::array(), perRank = json::array();
  for (int r = 0; r < span; ++r) {
    const auto it = ranks.find(r);
    if (it == ranks.end()) {
      summary.missingRanks.push_back(r);
      continue;
    }
    const RankMeta& m = it->second.first;
    rankList.push_back(r);
    if (!m.measured) summary.unmeasuredRanks.push_back(r);
    // Wrapping, not overflowing, on a crafted file's extremes.
    const int64_t drift =
        m.samples.empty() ? 0
                          : static_cast<int64_t>(static_cast<uint64_t>(m.samples.back().offsetNs) -
                                                 static_cast<uint64_t>(m.samples.front().offsetNs));
    perRank.push_back({{"rank", r},
                       {"host", m.host},
                       {"clock_offset_ns", m.offsetNs},
                       {"clock_error_ns", m.errorNs},
                       {"clock_measured", m.measured},
                       {"clock_measurements", m.samples.size()},
                       {"clock_drift_ns", drift},
                       {"recorded", m.recorded},
                       {"dropped", m.dropped},
                       {"capacity", m.capacity}});
  }
  const json other = {
      {"shoal_trace", kTraceFormatVersion},
      {"ranks", summary.ranks},
      {"rank_list", rankList},
      {"missing_ranks", summary.missingRanks},
      {"unmeasured_ranks", summary.unmeasuredRanks},
      {"alignment_error_ns", summary.alignmentErrorNs},
      {"alignment_error_us", static_cast<double>(summary.alignmentErrorNs) / 1e3},
      {"dropped", summary.dropped},
      {"clock",
       "times are rank 0's steady clock: each rank's shifted by its offset, interpolated "
       "between the offsets measured around it, within alignment_error_ns"},
      {"per_rank", perRank}};
  out.put("\n],\"displayTimeUnit\":\"ns\",\"otherData\":");
  out.put(other.dump(-1, ' ', false, json::error_handler_t::replace));
  out.put("}\n");
  out.commit();
  return summary;
}

std::string describe(const TraceMergeSummary& s, const std::string& outPath) {
  std::string line = fmt::format(
      "timeline of {} rank{} in {}: clocks aligned within {:.1f} us, {} "
      "span{} dropped",
      s.ranks, s.ranks == 1 ? "" : "s", outPath, static_cast<double>(s.alignmentErrorNs) / 1e3,
      s.dropped, s.dropped == 1 ? "" : "s");
  if (!s.missingRanks.empty()) {
    line += fmt::format("; no file from rank(s) {}", fmt::join(s.missingRanks, ", "));
  }
  if (!s.unmeasuredRanks.empty()) {
    line += fmt::format("; clocks not measured on rank(s) {}", fmt::join(s.unmeasuredRanks, ", "));
  }
  return line;
}

std::vector<std::string> rankTraceFiles(const std::string& dir) {
  std::map<int, std::string> byRank;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "trace folder {}: cannot be listed ({})", dir, ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) SHOAL_THROW(InvalidArgument, "trace folder {}: {}", dir, ec.message());
    const std::string name = it->path().filename().string();
    constexpr std::string_view kPrefix = "trace.rank", kSuffix = ".json";
    if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
        !name.ends_with(kSuffix)) {
      continue;
    }
    const std::string digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    if (digits.size() > 8 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    byRank[std::stoi(digits)] = it->path().string();
  }
  std::vector<std::string> out;
  for (auto& [rank, path] : byRank) out.push_back(std::move(path));
  return out;
}

TraceMergeSummary mergeTraceDir(const std::string& dir, const std::string& outPath,
                                const TraceMergeOptions& options) {
  const auto files = rankTraceFiles(dir);
  if (files.empty()) {
    SHOAL_THROW(InvalidArgument,
                "trace folder {}: no trace.rank<R>.json files (did the ranks "
                "run with SHOAL_TRACE={}?)",
                dir, dir);
  }
  return mergeTraces(files, outPath, options);
}

}  // namespace shoal::run
