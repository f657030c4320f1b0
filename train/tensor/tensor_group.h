// The tensor-parallel group a layer's slices live on, and what its collectives moved.
//
// A layer split over tensor-parallel ranks holds a TensorGroup: the group of ranks that hold the
// other slices (comm/group.h; null or size 1 means no parallelism: every collective below is the
// identity, so the same layer code is also the one-process model) and counters of the collectives
// issued for it, shared by every layer of one model (the benchmark reads the time spent in them,
// the tests count them against Megatron's two all-reduces per block forward and two backward).
//
// Threading: the counters are written by the thread running forward and backward (one training
// thread per rank); read them between steps.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/group.h"

namespace shoal::train::tensor {

struct CommCounters {
  int64_t forwardAllreduces = 0;
  int64_t backwardAllreduces = 0;
  int64_t allgathers = 0;  // forward and backward
  int64_t bytes = 0;       // payload bytes of every collective above
  double seconds = 0;      // wall time inside them (waiting for peers included)
  void reset() { *this = CommCounters{}; }
};

struct TensorGroup {
  std::shared_ptr<comm::Group> group;  // null or size 1: no tensor parallelism
  std::shared_ptr<CommCounters> counters = std::make_shared<CommCounters>();

  int rank() const { return group ? group->rank() : 0; }
  int size() const { return group ? group->size() : 1; }
  bool parallel() const { return size() > 1; }
};

// The contiguous slice [begin, begin + size) of `total` that `rank` of `ranks` holds: equal
// slices, the first `total % ranks` ranks one element more.
struct Slice {
  int64_t begin = 0;
  int64_t size = 0;
};
Slice sliceOf(int64_t total, int rank, int ranks);

}  // namespace shoal::train::tensor
