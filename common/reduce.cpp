#include "common/reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/error.h"
#include "common/half.h"

namespace shoal {

namespace {

template <typename T>
struct Sum {
  static T apply(T a, T b) { return a + b; }
};
template <typename T>
struct Prod {
  static T apply(T a, T b) { return a * b; }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return std::min(a, b); }
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return std::max(a, b); }
};

template <typename T, template <typename> class Op>
void loop(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op<T>::apply(a[i], b[i]);
}

// 16-bit floats: widen, apply, round. Written element-wise; with F16C the compiler vectorizes
// the _Float16 conversions.
template <template <typename> class Op, float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void loop16(uint16_t* __restrict dst, const uint16_t* __restrict a, const uint16_t* __restrict b,
            size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Narrow(Op<float>::apply(Widen(a[i]), Widen(b[i])));
}

// The sum and the average's division in one pass, computed exactly as Sum followed by
// scaleAverage's divideAll: floats multiply by the rounded reciprocal, integers divide the sum
// (wrapped to T first, as Sum stores it) truncating.
template <typename T>
void sumScaleLoop(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n,
                  int by) {
  if constexpr (std::is_floating_point_v<T>) {
    const T inv = T(1) / T(by);
    for (size_t i = 0; i < n; ++i) dst[i] = (a[i] + b[i]) * inv;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<T>(a[i] + b[i]) / by);
  }
}

// 16-bit: the sum stays in float and is scaled there; one rounding at the end.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void sumScaleLoop16(uint16_t* __restrict dst, const uint16_t* __restrict a,
                    const uint16_t* __restrict b, size_t n, int by) {
  const float inv = 1.0f / static_cast<float>(by);
  for (size_t i = 0; i < n; ++i) dst[i] = Narrow((Widen(a[i]) + Widen(b[i])) * inv);
}

void checkDivisor(ReduceOp op, int divisor) {
  if (divisor < 1 || (divisor > 1 && op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
    SHOAL_THROW(InvalidArgument, "reduce: divisor {} with op {} (only sum and avg divide)", divisor,
                static_cast<int>(op));
  }
}

template <typename T>
void dispatchOp(void* dst, const void* a, const void* b, size_t n, ReduceOp op, int divisor) {
  auto* d = static_cast<T*>(dst);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  if (divisor != 1) return sumScaleLoop<T>(d, x, y, n, divisor);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return loop<T, Sum>(d, x, y, n);
    case ReduceOp::kProduct:
      return loop<T, Prod>(d, x, y, n);
    case ReduceOp::kMin:
      return loop<T, Min>(d, x, y, n);
    case ReduceOp::kMax:
      return loop<T, Max>(d, x, y, n);
  }
  SHOAL_THROW(InvalidArgument, "invalid reduce op {}", static_cast<int>(op));
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void dispatchOp16(void* dst, const void* a, const void* b, size_t n, ReduceOp op, int divisor) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  if (divisor != 1) return sumScaleLoop16<Widen, Narrow>(d, x, y, n, divisor);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return loop16<Sum, Widen, Narrow>(d, x, y, n);
    case ReduceOp::kProduct:
      return loop16<Prod, Widen, Narrow>(d, x, y, n);
    case ReduceOp::kMin:
      return loop16<Min, Widen, Narrow>(d, x, y, n);
    case ReduceOp::kMax:
      return loop16<Max, Widen, Narrow>(d, x, y, n);
  }
  SHOAL_THROW(InvalidArgument, "invalid reduce op {}", static_cast<int>(op));
}

}  // namespace

void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
              int divisor) {
  if (divisor != 1) checkDivisor(op, divisor);
  switch (type) {
    case DataType::kFloat32:
      return dispatchOp<float>(dst, a, b, count, op, divisor);
    case DataType::kFloat64:
      return dispatchOp<double>(dst, a, b, count, op, divisor);
    case DataType::kInt32:
      return dispatchOp<int32_t>(dst, a, b, count, op, divisor);
    case DataType::kInt64:
      return dispatchOp<int64_t>(dst, a, b, count, op, divisor);
    case DataType::kUInt8:
      return dispatchOp<uint8_t>(dst, a, b, count, op, divisor);
    case DataType::kFloat16:
      return dispatchOp16<halfToFloat, floatToHalf>(dst, a, b, count, op, divisor);
    case DataType::kBFloat16:
      return dispatchOp16<bf16ToFloat, floatToBf16>(dst, a, b, count, op, divisor);
  }
  SHOAL_THROW(InvalidArgument, "invalid data type {}", static_cast<int>(type));
}

void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op, int divisor) {
  reduceTo(dst, dst, src, count, type, op, divisor);
}

namespace {
template <typename T>
void divideAll(void* data, size_t n, int by) {
  auto* p = static_cast<T*>(data);
  if constexpr (std::is_floating_point_v<T>) {
    const T inv = T(1) / T(by);
    for (size_t i = 0; i < n; ++i) p[i] *= inv;
  } else {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / by);
  }
}
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void divide16(void* data, size_t n, int by) {
  auto* p = static_cast<uint16_t*>(data);
  const float inv = 1.0f / static_cast<float>(by);
  for (size_t i = 0; i < n; ++i) p[i] = Narrow(Widen(p[i]) * inv);
}
}  // namespace

void scaleAverage(void* data, size_t count, DataType type, int n) {
  if (n == 1) return;
  switch (type) {
    case DataType::kFloat32:
      return divideAll<float>(data, count, n);
    case DataType::kFloat64:
      return divideAll<double>(data, count, n);
    case DataType::kInt32:
      return divideAll<int32_t>(data, count, n);
    case DataType::kInt64:
      return divideAll<int64_t>(data, count, n);
    case DataType::kUInt8:
      return divideAll<uint8_t>(data, count, n);
    case DataType::kFloat16:
      return divide16<halfToFloat, floatToHalf>(data, count, n);
    case DataType::kBFloat16:
      return divide16<bf16ToFloat, floatToBf16>(data, count, n);
  }
  SHOAL_THROW(InvalidArgument, "invalid data type {}", static_cast<int>(type));
}

}  // namespace shoal
