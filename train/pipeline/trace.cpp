#include "train/pipeline/trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "comm/collectives.h"
#include "common/error.h"

namespace shoal::train::pipeline {

namespace {

const char* colour(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "thread_state_running";
    case ActionKind::kBackward:
      return "thread_state_iowait";
    default:
      return "grey";
  }
}

}  // namespace

void writeChromeTrace(comm::Group& world, int stage, const std::vector<TraceEvent>& events,
                      const std::string& path) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& e : events) origin = std::min(origin, e.startUs);
  comm::allreduce(world, &origin, 1, DataType::kInt64, ReduceOp::kMin);
  std::string mine = fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}, stage {}"}}}})",
      world.rank(), world.rank(), stage);
  for (const auto& e : events) {
    mine += fmt::format(
        R"(,{{"name":"{}","cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":0,"cname":"{}",)"
        R"("args":{{"mb":{},"chunk":{}}}}})",
        describe(e.action), kindName(e.action.kind), e.startUs - origin,
        std::max<int64_t>(e.durationUs, 1), world.rank(), colour(e.action.kind),
        e.action.microBatch, e.action.chunk);
  }
  // Equal-sized pieces for one gather: every rank pads to the longest.
  int64_t longest = static_cast<int64_t>(mine.size());
  comm::allreduce(world, &longest, 1, DataType::kInt64, ReduceOp::kMax);
  mine.resize(static_cast<size_t>(longest), ' ');
  std::string all(world.rank() == 0 ? mine.size() * static_cast<size_t>(world.size()) : 0, ' ');
  comm::gather(world, mine.data(), all.data(), mine.size(), DataType::kUInt8, 0);
  if (world.rank() != 0) return;
  std::string body;
  for (int r = 0; r < world.size(); ++r) {
    std::string piece = all.substr(static_cast<size_t>(r) * mine.size(), mine.size());
    while (!piece.empty() && piece.back() == ' ') piece.pop_back();
    body += (r ? "," : "") + piece;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << R"({"displayTimeUnit":"ms","otherData":{"clock":"steady clock of each rank; )"
        << R"(aligned only between ranks of one host"},"traceEvents":[)" << body << "]}\n";
    if (!out) SHOAL_THROW(SystemError, "trace {}: cannot be written", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throwSystemError(fmt::format("trace: renaming {} to {}", tmp, path), errno);
  }
}

}  // namespace shoal::train::pipeline
