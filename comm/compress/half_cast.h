// fp32 <-> fp16 / bf16 casts of whole buffers (common/half.h converts one value): the payload of
// the fp16/bf16 codecs. Round to nearest even; fp16 overflows to +-inf like torch's .half().
//
// Thread-safe (pure functions). `half` must be DataType::kFloat16 or kBFloat16 (InvalidArgument).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace shoal::compress {

void encodeHalf(DataType half, const float* in, uint16_t* out, size_t n);
void decodeHalf(DataType half, const uint16_t* in, float* out, size_t n);

}  // namespace shoal::compress
