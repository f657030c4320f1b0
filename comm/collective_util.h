// Internal: the argument checks of the entry points (comm/collectives.h), made before anything
// moves so that a bad call fails locally and alone (InvalidArgument).
#pragma once

#include "comm/group.h"
#include "common/error.h"

namespace shoal::comm::detail {

// Argument checks done before anything moves, so a bad call fails locally and alone.
void checkBuffer(const Group& g, const void* p, size_t count, DataType type, const char* what);
void checkRoot(const Group& g, int root, const char* what);
void checkReduceOp(ReduceOp op);

}  // namespace shoal::comm::detail
