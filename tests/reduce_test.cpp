#include "common/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>

#include "common/error.h"
#include "common/half.h"

namespace shoal {
namespace {

TEST(Half, Float16RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 1025.0f}) {
    EXPECT_EQ(halfToFloat(floatToHalf(v)), v);
  }
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(1e6f))));
}

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16ToFloat(floatToBf16(-3.0f)), -3.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
}

template <typename T>
void checkKernel(DataType type) {
  std::mt19937 rng(42);
  const size_t n = 1037;  // odd: exercises the vector loop's tail
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(rng() % 50);
    b[i] = static_cast<T>(rng() % 50);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<T> d = a;
    reduceInto(d.data(), b.data(), n, type, op);
    for (size_t i = 0; i < n; ++i) {
      T want = op == ReduceOp::kSum       ? static_cast<T>(a[i] + b[i])
               : op == ReduceOp::kProduct ? static_cast<T>(a[i] * b[i])
               : op == ReduceOp::kMin     ? std::min(a[i], b[i])
                                          : std::max(a[i], b[i]);
      ASSERT_EQ(d[i], want) << toString(type) << " " << toString(op) << " at " << i;
    }
  }
}

TEST(Reduce, KernelsMatchScalarReference) {
  checkKernel<float>(DataType::kFloat32);
  checkKernel<double>(DataType::kFloat64);
  checkKernel<int32_t>(DataType::kInt32);
  checkKernel<int64_t>(DataType::kInt64);
  checkKernel<uint8_t>(DataType::kUInt8);
}

TEST(Reduce, SixteenBitFloatsAccumulateInFloat) {
  // 2048 + 1 is not representable in float16 (spacing 2 there); widening keeps each step exact
  // until the final rounding, so adding 1 three times to 2048 elementwise gives what float32
  // gives for each single step, rounded once per step.
  std::vector<uint16_t> a{floatToHalf(2048.0f), floatToHalf(0.5f)};
  std::vector<uint16_t> b{floatToHalf(2.0f), floatToHalf(0.25f)};
  reduceInto(a.data(), b.data(), 2, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(halfToFloat(a[0]), 2050.0f);
  EXPECT_EQ(halfToFloat(a[1]), 0.75f);
  std::vector<uint16_t> c{floatToBf16(3.0f)}, d{floatToBf16(4.0f)};
  reduceInto(c.data(), d.data(), 1, DataType::kBFloat16, ReduceOp::kProduct);
  EXPECT_EQ(bf16ToFloat(c[0]), 12.0f);
}

TEST(Reduce, AverageDividesOnce) {
  std::vector<float> f{8.0f, 3.0f};
  scaleAverage(f.data(), 2, DataType::kFloat32, 4);
  EXPECT_FLOAT_EQ(f[0], 2.0f);
  EXPECT_FLOAT_EQ(f[1], 0.75f);
  std::vector<int32_t> i{9, -9};
  scaleAverage(i.data(), 2, DataType::kInt32, 4);
  EXPECT_EQ(i[0], 2);
  EXPECT_EQ(i[1], -2);
}

// The sum and the division in one pass (the last step of an average) against the two passes.
template <typename T>
void checkSumAndScale(DataType type, int divisor) {
  std::mt19937 rng(7);
  const size_t n = 1037;
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      a[i] = static_cast<T>(std::uniform_real_distribution<double>(-100, 100)(rng));
      b[i] = static_cast<T>(std::uniform_real_distribution<double>(-100, 100)(rng));
    } else if constexpr (std::is_signed_v<T>) {
      a[i] = static_cast<T>(static_cast<int>(rng() % 2001) - 1000);
      b[i] = static_cast<T>(static_cast<int>(rng() % 2001) - 1000);
    } else {
      a[i] = static_cast<T>(rng());  // uint8: the sum wraps before the division
      b[i] = static_cast<T>(rng());
    }
  }
  std::vector<T> fused = a, twoPasses = a;
  reduceInto(fused.data(), b.data(), n, type, ReduceOp::kAvg, divisor);
  reduceInto(twoPasses.data(), b.data(), n, type, ReduceOp::kSum);
  scaleAverage(twoPasses.data(), n, type, divisor);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&fused[i], &twoPasses[i], sizeof(T)), 0)
        << toString(type) << " / " << divisor << " at " << i << ": " << +fused[i] << " vs "
        << +twoPasses[i];
  }
}

TEST(Reduce, SumAndScaleEqualsTheSumThenTheDivision) {
  for (int divisor : {2, 3, 7}) {
    checkSumAndScale<float>(DataType::kFloat32, divisor);
    checkSumAndScale<double>(DataType::kFloat64, divisor);
    checkSumAndScale<int32_t>(DataType::kInt32, divisor);
    checkSumAndScale<int64_t>(DataType::kInt64, divisor);
    checkSumAndScale<uint8_t>(DataType::kUInt8, divisor);
  }
  // Truncation toward zero, as the separate pass did.
  std::vector<int32_t> i{-7, 7}, j{-2, 2};
  reduceInto(i.data(), j.data(), 2, DataType::kInt32, ReduceOp::kAvg, 4);
  EXPECT_EQ(i[0], -2);
  EXPECT_EQ(i[1], 2);
}

TEST(Reduce, SixteenBitSumAndScaleRoundsOnce) {
  // The two passes round the sum to 16 bits and then the quotient; the one pass rounds only the
  // quotient: never further from the exact average, and at most one unit in the last place
  // from the two passes.
  std::mt19937 rng(3);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    auto widen = t == DataType::kFloat16 ? halfToFloat : bf16ToFloat;
    auto narrow = t == DataType::kFloat16 ? floatToHalf : floatToBf16;
    const size_t n = 4099;
    std::vector<uint16_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = narrow(std::uniform_real_distribution<float>(-50, 50)(rng));
      b[i] = narrow(std::uniform_real_distribution<float>(-50, 50)(rng));
    }
    std::vector<uint16_t> fused = a, twoPasses = a;
    reduceInto(fused.data(), b.data(), n, t, ReduceOp::kAvg, 3);
    reduceInto(twoPasses.data(), b.data(), n, t, ReduceOp::kSum);
    scaleAverage(twoPasses.data(), n, t, 3);
    for (size_t i = 0; i < n; ++i) {
      const float exact = (widen(a[i]) + widen(b[i])) / 3.0f;
      const float f = widen(fused[i]), p = widen(twoPasses[i]);
      // One rounding: the nearest representable value to the exact average (ties aside).
      EXPECT_LE(std::fabs(f - exact), std::fabs(p - exact) + 1e-7f * std::fabs(exact))
          << toString(t) << " at " << i;
      const int df = std::abs((fused[i] & 0x7fff) - (twoPasses[i] & 0x7fff));
      EXPECT_TRUE(df <= 1 || (f == 0 && p == 0)) << toString(t) << " at " << i;
    }
  }
}

TEST(Reduce, OnlySumAndAverageDivide) {
  float a = 1, b = 2;
  EXPECT_THROW(reduceInto(&a, &b, 1, DataType::kFloat32, ReduceOp::kMax, 2), InvalidArgument);
  EXPECT_THROW(reduceInto(&a, &b, 1, DataType::kFloat32, ReduceOp::kSum, 0), InvalidArgument);
  reduceInto(&a, &b, 1, DataType::kFloat32, ReduceOp::kMax, 1);
  EXPECT_EQ(a, 2.0f);
}

TEST(Types, NamesParseAndBadNamesAreClearErrors) {
  EXPECT_EQ(parseDataType("bfloat16"), DataType::kBFloat16);
  EXPECT_EQ(parseReduceOp("product"), ReduceOp::kProduct);
  try {
    parseDataType("float8");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
  }
  EXPECT_THROW(parseReduceOp("mean"), InvalidArgument);
}

}  // namespace
}  // namespace shoal
