// Element-wise reduction kernels: dst[i] = dst[i] (op) src[i].
//
// Loops are written so the compiler vectorizes them. float16 and bfloat16 are widened to float32
// for every operation and rounded once per result, so a reduction of n buffers rounds n-1 times
// (never accumulates in 16 bits through a wider chain). kAvg reduces as kSum; the division by the
// world size is a separate pass (scaleAverage) done once by the algorithm at the end.
#pragma once

#include <cstddef>

#include "common/types.h"

namespace shoal {

// dst and src may not overlap (unless equal, which is allowed for the idempotent ops).
void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

// dst[i] = a[i] (op) b[i]; dst may alias a.
void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op);

// Divides every element by n (integer types: truncating division, as the sum divided by n).
void scaleAverage(void* data, size_t count, DataType type, int n);

}  // namespace shoal
