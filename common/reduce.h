// Element-wise reduction kernels: dst[i] = dst[i] (op) src[i].
//
// Loops are written so the compiler vectorizes them. float16 and bfloat16 are widened to float32
// for every operation and rounded once per result, so a reduction of n buffers rounds n-1 times
// (never accumulates in 16 bits through a wider chain). kAvg reduces as kSum; the division by the
// world size is folded into the step that completes each element's sum (the `divisor` of
// reduceInto / reduceTo: Note [Average in the last step] in comm/native/algorithms.h), so no
// algorithm makes a separate pass over the result. scaleAverage remains for a backend that cannot
// fold it (MPI).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace shoal {

// dst and src may not overlap (unless equal, which is allowed for the idempotent ops).
//
// divisor > 1 (only for kSum and kAvg, else InvalidArgument) divides each result by it in the
// same pass: dst[i] = (dst[i] + src[i]) / divisor, the sum then scaleAverage's division with
// one pass over memory instead of two. Results are those of reduceInto followed by
// scaleAverage: bit for bit for float32, float64 (both multiply by the rounded 1/divisor) and
// the integer types (the wrapped sum, divided truncating); float16 / bfloat16 keep the sum in
// float and round once instead of twice, so they differ from the two passes by at most one unit
// in the last place (and are never further from the exact average).
void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op,
                int divisor = 1);

// dst[i] = a[i] (op) b[i] (divided by divisor as above); dst may alias a.
void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
              int divisor = 1);

// Divides every element by n (integer types: truncating division, as the sum divided by n).
void scaleAverage(void* data, size_t count, DataType type, int n);

// float32 -> float16 and back, `count` elements, with the widest instruction set the CPU has
// (common/reduce_isa.h): element for element what common/half.h's floatToHalf / halfToFloat
// give (round to nearest even), many times faster than a loop over those in a portable build.
void convertToHalf(const float* in, uint16_t* out, size_t count);
void convertFromHalf(const uint16_t* in, float* out, size_t count);

}  // namespace shoal
