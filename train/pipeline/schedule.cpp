// What every schedule shares: where a transfer goes, the builders of a compute step with its
// transfers, the choice by name, and the memory measure.
#include "train/pipeline/schedule.h"

#include <algorithm>

#include "common/error.h"

namespace shoal::train::pipeline {

namespace {

bool isTransfer(ActionKind kind) {
  return kind != ActionKind::kForward && kind != ActionKind::kBackward;
}

// The virtual stage at the other end of a transfer of virtual stage `stage`.
int otherEnd(int stage, ActionKind kind) {
  switch (kind) {
    case ActionKind::kSendActivation:
    case ActionKind::kRecvGradient:
      return stage + 1;
    case ActionKind::kRecvActivation:
    case ActionKind::kSendGradient:
      return stage - 1;
    default:
      return stage;
  }
}

void checkTransfer(const Schedule& s, int rank, const Action& a) {
  if (!isTransfer(a.kind)) {
    SHOAL_THROW(InvalidArgument, "{} is no transfer: it has no peer or boundary", describe(a));
  }
  if (rank < 0 || rank >= s.stages || a.chunk < 0 || a.chunk >= s.chunks) {
    SHOAL_THROW(InvalidArgument, "{} on rank {}: rank or chunk out of range (p {}, v {})",
                describe(a), rank, s.stages, s.chunks);
  }
  const int other = otherEnd(s.virtualStage(rank, a.chunk), a.kind);
  if (other < 0 || other >= s.virtualStages()) {
    SHOAL_THROW(InvalidArgument, "{} on rank {}: virtual stage {} has no neighbour there",
                describe(a), rank, s.virtualStage(rank, a.chunk));
  }
}

void checkShape(int stages, int microBatches, int chunks) {
  if (stages < 1) SHOAL_THROW(InvalidArgument, "pipeline schedule: {} stages (need >= 1)", stages);
  if (microBatches < 1) {
    SHOAL_THROW(InvalidArgument, "pipeline schedule: {} micro-batches (need >= 1)", microBatches);
  }
  if (chunks < 1) SHOAL_THROW(InvalidArgument, "pipeline schedule: {} chunks (need >= 1)", chunks);
}

}  // namespace

int Schedule::peer(int rank, const Action& a) const {
  checkTransfer(*this, rank, a);
  return rankOf(otherEnd(virtualStage(rank, a.chunk), a.kind));
}

int Schedule::boundary(int rank, const Action& a) const {
  checkTransfer(*this, rank, a);
  const int stage = virtualStage(rank, a.chunk);
  return std::min(stage, otherEnd(stage, a.kind));
}

void appendForward(Schedule& s, int rank, int microBatch, int chunk) {
  auto& list = s.ranks.at(static_cast<size_t>(rank));
  const int stage = s.virtualStage(rank, chunk);
  if (stage > 0) list.push_back({ActionKind::kRecvActivation, microBatch, chunk});
  list.push_back({ActionKind::kForward, microBatch, chunk});
  if (stage < s.virtualStages() - 1)
    list.push_back({ActionKind::kSendActivation, microBatch, chunk});
}

void appendBackward(Schedule& s, int rank, int microBatch, int chunk) {
  auto& list = s.ranks.at(static_cast<size_t>(rank));
  const int stage = s.virtualStage(rank, chunk);
  if (stage < s.virtualStages() - 1) list.push_back({ActionKind::kRecvGradient, microBatch, chunk});
  list.push_back({ActionKind::kBackward, microBatch, chunk});
  if (stage > 0) list.push_back({ActionKind::kSendGradient, microBatch, chunk});
}

Schedule makeSchedule(std::string_view name, int stages, int microBatches, int chunks) {
  checkShape(stages, microBatches, chunks);
  if (name == "gpipe") return gpipe(stages, microBatches);
  if (name == "1f1b") return oneForwardOneBackward(stages, microBatches);
  if (name == "interleaved") return interleavedOneForwardOneBackward(stages, microBatches, chunks);
  SHOAL_THROW(InvalidArgument, "unknown pipeline schedule '{}' (gpipe, 1f1b, interleaved)", name);
}

int peakInFlight(const Schedule& s, int rank) {
  if (rank < 0 || rank >= static_cast<int>(s.ranks.size())) {
    SHOAL_THROW(InvalidArgument, "peakInFlight: rank {} of a schedule with {} rank lists", rank,
                s.ranks.size());
  }
  int inFlight = 0, peak = 0;
  for (const Action& a : s.ranks[static_cast<size_t>(rank)]) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++inFlight);
    if (a.kind == ActionKind::kBackward) --inFlight;
  }
  return peak;
}

std::string_view kindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "Forward";
    case ActionKind::kBackward:
      return "Backward";
    case ActionKind::kSendActivation:
      return "SendActivation";
    case ActionKind::kRecvActivation:
      return "RecvActivation";
    case ActionKind::kSendGradient:
      return "SendGradient";
    case ActionKind::kRecvGradient:
      return "RecvGradient";
  }
  return "UnknownAction";
}

std::string describe(const Action& a) {
  return fmt::format("{}(mb {}, chunk {})", kindName(a.kind), a.microBatch, a.chunk);
}

}  // namespace shoal::train::pipeline
