// A pipeline step's timeline from every rank, as one Chrome trace / Perfetto JSON file
// (chrome://tracing, ui.perfetto.dev): one process row per world rank ("rank r, stage s"),
// one box per action (forward, backward, send, receive) named by micro-batch and chunk.
//
// Times come from each rank's steady clock (CLOCK_MONOTONIC), which ranks of one host share;
// across hosts they are not aligned (the file says so in its metadata). The first action of
// the job is at 0.
//
// Collective over `world`: every rank passes its events; world rank 0 writes `path`
// (atomically: a temporary file renamed). Blocking, bounded by the group timeout. SystemError if
// the file cannot be written (on rank 0; the others get a PeerError naming it).
#pragma once

#include <string>
#include <vector>

#include "comm/group.h"
#include "train/pipeline/executor.h"

namespace shoal::train::pipeline {

void writeChromeTrace(comm::Group& world, int stage, const std::vector<TraceEvent>& events,
                      const std::string& path);

}  // namespace shoal::train::pipeline
