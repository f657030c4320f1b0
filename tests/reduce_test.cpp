#include "common/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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
