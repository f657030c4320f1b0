#include "common/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace shoal {

namespace {

using nlohmann::json;

// Nanoseconds on rank 0's clock as the format's microseconds; the fraction keeps the
// nanoseconds (a double holds a steady-clock time in microseconds to better than 1 ns for
// centuries of uptime).
double micros(int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}

json argsOf(const TraceSpan& s) {
  json args = json::object();
  for (size_t i = 0; i < s.argCount && i < kMaxTraceArgs; ++i) {
    const TraceArg& a = s.args[i];
    switch (a.kind) {
      case TraceArg::Kind::kInt:
        args[a.key] = a.intValue;
        break;
      case TraceArg::Kind::kDouble:
        args[a.key] = a.doubleValue;
        break;
      case TraceArg::Kind::kText:
      case TraceArg::Kind::kStaticText:
        args[a.key] = std::string(s.text(a));
        break;
    }
  }
  return args;
}

void writeAll(int fd, const std::string& path, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throwSystemError("trace: write " + path, errno);
    done += static_cast<size_t>(w);
  }
}

}  // namespace

std::string rankTraceJson(const std::vector<TraceSpan>& spans, const RankTraceInfo& info,
                          uint64_t recorded, uint64_t dropped, size_t capacity) {
  json events = json::array();
  for (const TraceSpan& s : spans) {
    const double ts = micros(s.beginNs + info.clockOffsetNs);
    // Invalid UTF-8 in a name or text (a user's op name) must not make the file unwritable:
    // dump() below replaces it instead of throwing.
    json e = {{"name", s.name}, {"cat", s.category}, {"pid", info.rank}, {"tid", s.thread}};
    if (s.asyncId == 0) {
      e["ph"] = "X";
      e["ts"] = ts;
      e["dur"] = micros(s.endNs - s.beginNs);
      e["args"] = argsOf(s);
      events.push_back(std::move(e));
      continue;
    }
    json end = e;
    e["ph"] = "b";
    e["ts"] = ts;
    e["id"] = s.asyncId;
    e["args"] = argsOf(s);
    end["ph"] = "e";
    end["ts"] = micros(s.endNs + info.clockOffsetNs);
    end["id"] = s.asyncId;
    events.push_back(std::move(e));
    events.push_back(std::move(end));
  }
  json samples = json::array();
  for (const ClockSample& c : info.clockSamples) {
    samples.push_back({{"at_ns", c.atNs}, {"offset_ns", c.offsetNs}, {"error_ns", c.errorNs}});
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ns"},
              {"otherData",
               {{"shoal_trace", kTraceFormatVersion},
                {"rank", info.rank},
                {"host", info.host},
                {"clock_offset_ns", info.clockOffsetNs},
                {"clock_error_ns", info.clockErrorNs},
                {"clock_measured", info.clockMeasured},
                {"recorded", recorded},
                {"dropped", dropped},
                {"capacity", capacity},
                {"clock_sync", std::move(samples)}}}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

void writeRankTrace(const TraceSink& sink, const RankTraceInfo& info, const std::string& path) {
  uint64_t recorded = 0, dropped = 0;
  const auto spans = sink.snapshot(&recorded, &dropped);
  writeFileAtomically(path, rankTraceJson(spans, info, recorded, dropped, sink.capacity()));
}

void writeFileAtomically(const std::string& path, std::string_view text) {
  // One temporary per thread: ranks of one job never share a path, but a rank could write
  // its file twice at once (an explicit write and the world's teardown on two threads).
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), TraceSink::currentThread());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throwSystemError("trace: open " + tmp, errno);
  try {
    writeAll(fd, tmp, text);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throwSystemError(fmt::format("trace: rename {} to {}", tmp, path), err);
  }
}

std::string localHostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

}  // namespace shoal
