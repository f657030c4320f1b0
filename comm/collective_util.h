// Internal helpers shared by the collective entry points.
#pragma once

#include <functional>
#include <memory>

#include "comm/group.h"
#include "common/error.h"
#include "transport/frame.h"

namespace shoal::comm::detail {

// The frame template every message of one operation carries.
transport::FrameHeader baseHeader(size_t count, DataType type, ReduceOp op = ReduceOp::kSum,
                                  int root = 0);

// Argument checks done before anything moves, so a bad call fails locally and alone.
void checkBuffer(const Group& g, const void* p, size_t count, DataType type, const char* what);
void checkRoot(const Group& g, int root, const char* what);
void checkReduceOp(ReduceOp op);

// The caller's buffers, for a group that runs on a backend (see comm/backend.h).
struct Buffers {
  const void* send = nullptr;
  void* recv = nullptr;  // the in-place buffer or the output
};

// Runs `body` synchronously (async = false, returns null) or queues it and returns its Work.
// A backend group runs the operation described by `base` and `buffers` instead.
std::shared_ptr<Work> dispatch(Group& g, bool async, transport::OpCode op,
                               const transport::FrameHeader& base, const CallOptions& call,
                               Buffers buffers, std::function<void(OpContext&)> body);

}  // namespace shoal::comm::detail
