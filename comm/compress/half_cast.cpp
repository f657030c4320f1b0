#include "comm/compress/half_cast.h"

#include "common/error.h"
#include "common/half.h"
#include "common/reduce.h"

namespace shoal::compress {

namespace {

void checkHalf(const char* what, DataType half) {
  if (half != DataType::kFloat16 && half != DataType::kBFloat16) {
    SHOAL_THROW(InvalidArgument, "{}: {} is not a 16-bit float type (float16 or bfloat16)", what,
                toString(half));
  }
}

}  // namespace

// The loops are the per-value converters of common/half.h, kept free of branches and calls so
// that the compiler vectorizes them (F16C's vcvtps2ph / vcvtph2ps for float16 under
// -march=native).
void encodeHalf(DataType half, const float* in, uint16_t* out, size_t n) {
  checkHalf("encodeHalf", half);
  if (half == DataType::kFloat16) {
    convertToHalf(in, out, n);  // F16C where the CPU has it (common/reduce.h)
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = floatToBf16(in[i]);
  }
}

void decodeHalf(DataType half, const uint16_t* in, float* out, size_t n) {
  checkHalf("decodeHalf", half);
  if (half == DataType::kFloat16) {
    convertFromHalf(in, out, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(in[i]);
  }
}

}  // namespace shoal::compress
