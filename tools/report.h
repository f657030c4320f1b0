// `shoal report RUN_DIR [-o OUT]`: a static report of one run (run/run_directory.h) to share,
// readable without Shoal or a server:
//   OUT/report.html   self-contained (inline style, no script, nothing fetched from elsewhere):
//                     the record (name, command, status, exit code, ranks, hosts, git
//                     revision, start, end, duration, attempts); per metric its plot and each
//                     rank's last / min / max / mean; each rank's step time split into compute
//                     and communication wait; the stragglers (tools/run_summary.h, Note
//                     [Stragglers]); points the ranks dropped
//   OUT/<metric>.png  one chart per metric (tools/plot.h): each rank's line and their mean
//
// Safety: the files come from a job and are untrusted. Every text taken from them is
// HTML-escaped; a PNG's file name is the metric's name with every character outside
// [A-Za-z0-9_.-] made '_', leading dots made '_', cut to 200 bytes and made unique with a
// suffix (reportFileStem), so nothing is written outside OUT whatever a metric is called. The
// run directory is only read (run.json; metrics.db opened read-only).
//
// Blocking (file system only); not thread-safe against another report into the same OUT. Each
// file is written atomically (a temporary beside it, renamed over it); report.html last, so a
// report.html present refers to plots that exist.
#pragma once

#include <set>
#include <string>
#include <string_view>

namespace shoal::tools {

struct ReportResult {
  std::string htmlPath;  // OUT/report.html
  int plots = 0;         // PNG files written
};

// Writes the report of `runDir` into `outDir` (default, when empty: runDir/report; created if
// missing). A run without metrics.db gives a report of its record alone. InvalidArgument, one
// line naming the file, for a run directory without a readable run.json or with a metrics.db
// that is not a Shoal metrics store; SystemError naming the file for a failed write.
ReportResult writeReport(const std::string& runDir, const std::string& outDir = {});

// A file name stem for `metric` as the file comment says, not in `taken` (which it is added to).
std::string reportFileStem(std::string_view metric, std::set<std::string>& taken);

// `text` with & < > " ' as character references.
std::string htmlEscape(std::string_view text);

}  // namespace shoal::tools
