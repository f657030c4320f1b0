#include "tools/tensorboard_export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/trace_file.h"
#include "run/run_directory.h"
#include "tools/tensorboard_writer.h"
#include "track/metrics_store.h"

namespace shoal::tools {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

// Finite doubles beyond float32's range would become infinities in simple_value.
bool fitsFloat(double v) {
  return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
}

// Every rank's points, by rank, each rank's in the order the file comment gives.
std::map<int, std::vector<track::MetricRow>> pointsByRank(track::MetricsStore& store) {
  std::map<int, std::vector<track::MetricRow>> ranks;
  for (const std::string& name : store.metricNames()) {
    for (track::MetricRow& row : store.series(name)) ranks[row.rank].push_back(std::move(row));
  }
  for (auto& [rank, rows] : ranks) {
    std::sort(rows.begin(), rows.end(), [](const track::MetricRow& a, const track::MetricRow& b) {
      return std::tie(a.step, a.wallNs, a.id) < std::tie(b.step, b.wallNs, b.id);
    });
  }
  return ranks;
}

void makeFolder(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    SHOAL_THROW(SystemError, "tensorboard folder {}: cannot create it: {}", dir,
                ec ? ec.message() : "not a folder");
  }
}

// Earlier exports' files in `dir` other than `keep` (the one just written).
void removeOtherEventFiles(const std::string& dir, const std::string& keep) {
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kEventFilePrefix, 0) != 0 || e.path().string() == keep) continue;
    std::error_code ec;
    fs::remove(e.path(), ec);
    if (ec) {
      SHOAL_THROW(SystemError, "tensorboard folder {}: cannot remove the old {}: {}", dir, name,
                  ec.message());
    }
  }
}

TensorBoardRankFile writeRank(const std::string& dir, int rank,
                              const std::vector<track::MetricRow>& rows, const std::string& host) {
  TensorBoardRankFile out{.rank = rank};
  const auto first =
      std::find_if(rows.begin(), rows.end(), [](const auto& r) { return fitsFloat(r.value); });
  if (first == rows.end()) {
    out.skipped = rows.size();
    return out;
  }
  // The file's name and version event date from the rank's earliest point, not its first step.
  int64_t earliestNs = first->wallNs;
  for (const track::MetricRow& r : rows) {
    if (fitsFloat(r.value)) earliestNs = std::min(earliestNs, r.wallNs);
  }
  makeFolder(dir);
  EventFileWriter writer(dir, earliestNs / 1'000'000'000, host, earliestNs / 1e9);
  std::set<std::string_view> tags;
  for (const track::MetricRow& r : rows) {
    if (!fitsFloat(r.value)) {
      ++out.skipped;
      continue;
    }
    writer.addScalar(r.name, r.step, static_cast<float>(r.value), r.wallNs / 1e9);
    tags.insert(r.name);
    ++out.points;
  }
  out.path = writer.finish();
  out.tags = tags.size();
  removeOtherEventFiles(dir, out.path);
  return out;
}

}  // namespace

TensorBoardExport exportTensorBoard(const std::string& runDir, const std::string& outDir) {
  run::readRunRecord(runDir);  // a run directory, or InvalidArgument naming run.json
  const std::string db = run::metricsPath(runDir);
  if (!fs::exists(db)) {
    SHOAL_THROW(InvalidArgument, "{}: no such file: the run logged no metrics", db);
  }
  TensorBoardExport result{.outDir = outDir.empty() ? runDir + "/tensorboard" : outDir};
  std::map<int, std::vector<track::MetricRow>> ranks;
  {
    track::MetricsStore store(db, {.readOnly = true});
    ranks = pointsByRank(store);
  }
  makeFolder(result.outDir);
  const std::string host = localHostName();
  for (const auto& [rank, rows] : ranks) {
    TensorBoardRankFile f =
        writeRank(fmt::format("{}/rank{}", result.outDir, rank), rank, rows, host);
    result.points += f.points;
    result.skipped += f.skipped;
    if (!f.path.empty()) result.files.push_back(std::move(f));
  }
  return result;
}

}  // namespace shoal::tools
