// `shoal tensorboard RUN_DIR [--out DIR]`: a run's metrics (track/metrics_store.h) as
// TensorBoard event files (tools/tensorboard_writer.h), so `tensorboard --logdir DIR` shows
// them beside runs logged by other tools.
//
// Layout: one event file per rank, OUT/rank<r>/events.out.tfevents.<seconds>.<host>. TensorBoard
// makes each folder holding event files a run, so every rank is a run of its own (colour and
// toggle per rank, as in its multi-run view) and a metric's name is its tag: "loss" of rank 0
// and rank 1 share one chart. <seconds> is the rank's first point's wall time, so exporting the
// same run again gives the same names; <host> is this machine's (the exporter's, as TensorFlow
// names the writer's host).
//
// Each rank's points are written in step order (ties: wall time, then the order they were
// logged), each event with the point's wall time from the store. TensorBoard's scalars are
// float32: a point whose value is NaN, infinite or outside float32's range is skipped and
// counted, not written.
//
// Re-export: each rank's file is written whole to a hidden temporary and renamed over the old
// one, and any other events.out.tfevents.* file in that rank's folder (an earlier export from
// another host) is removed, so TensorBoard never sees a point twice. Nothing else in OUT is
// touched. The run directory is only read (run.json; metrics.db opened read-only).
//
// Blocking (file system only); not thread-safe against another export into the same OUT.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace shoal::tools {

struct TensorBoardRankFile {
  int rank = 0;
  std::string path;
  size_t points = 0;   // scalar events written
  size_t skipped = 0;  // points not finite as float32
  size_t tags = 0;     // distinct metrics written
};

struct TensorBoardExport {
  std::string outDir;
  std::vector<TensorBoardRankFile> files;  // by rank; none for a rank with no finite point
  size_t points = 0;                       // over all ranks
  size_t skipped = 0;
};

// Writes the event files of `runDir` into `outDir` (default, when empty: runDir/tensorboard;
// created if missing). A store without points writes nothing (files empty). InvalidArgument,
// one line naming the file, for a folder without a readable run.json (missing, or not a run
// directory), a run without metrics.db, or a metrics.db that is not a Shoal metrics store;
// SystemError naming the file for a failed write; what the store's reads throw.
TensorBoardExport exportTensorBoard(const std::string& runDir, const std::string& outDir = {});

}  // namespace shoal::tools
