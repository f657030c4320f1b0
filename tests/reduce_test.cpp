#include "common/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "common/reduce_isa.h"

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

// The kernels run the elements before the destination's first 64-byte boundary apart from the
// rest (common/reduce_kernels.inc): at every offset from a line, and lengths that end before,
// at and after that boundary, each element is its own sum (and the average's division), in
// every instruction set, and nothing outside [dst, dst + count) is written.
TEST(Reduce, EveryDestinationOffsetSumsEveryElementOnce) {
  for (const auto& k : reduce_isa::available()) {
    for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kUInt8}) {
      const size_t width = elementSize(type);
      for (size_t offset = 0; offset < 64 / width; ++offset) {
        for (size_t count : {size_t{1}, size_t{3}, size_t{17}, size_t{200}}) {
          // 64-byte aligned storage with a guard element on each side.
          std::vector<double> storage((count + 2 * 64) * width / sizeof(double) + 16);
          auto* line = reinterpret_cast<uint8_t*>(
              (reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64);
          uint8_t* dst = line + 64 + offset * width;
          std::vector<uint8_t> b(count * width), before(count * width);
          for (size_t i = 0; i < count; ++i) {
            auto put = [&](uint8_t* at, int v) {
              if (type == DataType::kFloat32) {
                const float f = static_cast<float>(v);
                std::memcpy(at, &f, 4);
              } else if (type == DataType::kFloat64) {
                const double d = v;
                std::memcpy(at, &d, 8);
              } else {
                *at = static_cast<uint8_t>(v);
              }
            };
            put(dst + i * width, static_cast<int>(i % 50));
            put(b.data() + i * width, static_cast<int>(2 * (i % 50) + 1));
          }
          std::memcpy(before.data(), dst, before.size());
          dst[-1] = 0xAB;
          dst[count * width] = 0xCD;
          k.reduceTo(dst, dst, b.data(), count, type, ReduceOp::kSum, 1);
          for (size_t i = 0; i < count; ++i) {
            const double want = 3 * static_cast<double>(i % 50) + 1;
            double got = 0;
            if (type == DataType::kFloat32) {
              float f;
              std::memcpy(&f, dst + i * width, 4);
              got = f;
            } else if (type == DataType::kFloat64) {
              std::memcpy(&got, dst + i * width, 8);
            } else {
              got = dst[i];
            }
            ASSERT_EQ(got, want) << k.name << " " << toString(type) << " offset " << offset
                                 << " count " << count << " element " << i;
          }
          EXPECT_EQ(dst[-1], 0xAB) << k.name << " wrote before dst";
          EXPECT_EQ(dst[count * width], 0xCD) << k.name << " wrote past dst";
        }
      }
    }
  }
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

// Equal bit for bit, except that any NaN equals any NaN: which payload survives an operation on
// two NaNs depends on the operand order the compiler chose, which may differ between the
// scalar and the vector code.
bool sameResults(DataType type, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return false;
  const size_t width = elementSize(type);
  for (size_t i = 0; i < got.size(); i += width) {
    if (std::memcmp(&got[i], &want[i], width) == 0) continue;
    auto isNan = [&](const uint8_t* p) {
      switch (type) {
        case DataType::kFloat32: {
          float f;
          std::memcpy(&f, p, 4);
          return std::isnan(f);
        }
        case DataType::kFloat64: {
          double d;
          std::memcpy(&d, p, 8);
          return std::isnan(d);
        }
        case DataType::kFloat16:
        case DataType::kBFloat16: {
          uint16_t h;
          std::memcpy(&h, p, 2);
          return std::isnan(type == DataType::kFloat16 ? halfToFloat(h) : bf16ToFloat(h));
        }
        default:
          return false;
      }
    };
    if (!isNan(&got[i]) || !isNan(&want[i])) return false;
  }
  return true;
}

// The build is portable and picks its kernels at run time (common/reduce_isa.h): every
// instruction set this CPU runs must give the generic kernels' results bit for bit (NaN
// payloads aside), for every
// type, op and divisor, at lengths around the vector widths, special values included.
TEST(ReduceIsa, EveryInstructionSetComputesTheGenericBits) {
  const auto sets = reduce_isa::available();
  ASSERT_FALSE(sets.empty());
  EXPECT_EQ(sets.front().name, "generic");
  bool selectedIsAvailable = false;
  for (const auto& k : sets) selectedIsAvailable |= k.name == reduce_isa::selected().name;
  EXPECT_TRUE(selectedIsAvailable) << reduce_isa::selected().name;

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 65504.0f, -1.5f};
  for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64,
                        DataType::kUInt8, DataType::kFloat16, DataType::kBFloat16}) {
    const size_t width = elementSize(type);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1027}}) {
      std::vector<uint8_t> a(count * width), b(count * width);
      for (auto& x : a) x = static_cast<uint8_t>(byte(rng));
      for (auto& x : b) x = static_cast<uint8_t>(byte(rng));
      // Random bytes make NaNs and huge values; a few exact specials besides.
      for (size_t i = 0; i < count && i < 8 && type == DataType::kFloat32; ++i) {
        std::memcpy(&a[i * 4], &specials[i], 4);
      }
      for (ReduceOp op :
           {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
        for (int divisor : {1, 3}) {
          if (divisor != 1 && op != ReduceOp::kSum && op != ReduceOp::kAvg) continue;
          std::vector<uint8_t> want(a.size());
          sets.front().reduceTo(want.data(), a.data(), b.data(), count, type, op, divisor);
          std::vector<uint8_t> scaledWant = a;
          sets.front().scaleAverage(scaledWant.data(), count, type, 5);
          for (const auto& k : sets) {
            std::vector<uint8_t> got(a.size());
            k.reduceTo(got.data(), a.data(), b.data(), count, type, op, divisor);
            EXPECT_TRUE(sameResults(type, got, want))
                << k.name << " " << toString(type) << " count " << count << " op "
                << static_cast<int>(op) << " divisor " << divisor;
            std::vector<uint8_t> scaled = a;
            k.scaleAverage(scaled.data(), count, type, 5);
            EXPECT_TRUE(sameResults(type, scaled, scaledWant))
                << k.name << " scaleAverage " << toString(type);
          }
        }
      }
    }
  }
}

TEST(ReduceIsa, EveryInstructionSetConvertsToAndFromFloat16AsTheScalarFunctions) {
  // Every float16 pattern back to float32, and floats around every float16 value (the value,
  // the ties between neighbours, just above and below them) plus the special ones to float16.
  std::vector<uint16_t> halves(65536);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats = {0.0f,  -0.0f,    1e-10f,    -1e-10f, 65504.0f, 65520.0f, 1e6f,
                               -1e6f, INFINITY, -INFINITY, NAN,     5.96e-8f, 2.98e-8f, 3e-8f};
  for (uint16_t h = 0; h < 0x7c00; ++h) {
    const float v = halfToFloat(h), next = halfToFloat(static_cast<uint16_t>(h + 1));
    const float tie = v + (next - v) / 2;
    for (float f : {v, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)}) {
      floats.push_back(f);
      floats.push_back(-f);
    }
  }
  for (const auto& set : reduce_isa::available()) {
    std::vector<float> widened(halves.size());
    set.fromHalf(halves.data(), widened.data(), halves.size());
    for (size_t i = 0; i < halves.size(); ++i) {
      const float expected = halfToFloat(halves[i]);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(widened[i])) << set.name << " " << i;
      } else {
        EXPECT_EQ(std::memcmp(&widened[i], &expected, 4), 0) << set.name << " " << i;
      }
    }
    std::vector<uint16_t> narrowed(floats.size());
    set.toHalf(floats.data(), narrowed.data(), floats.size());
    for (size_t i = 0; i < floats.size(); ++i) {
      if (std::isnan(floats[i])) {
        EXPECT_TRUE(std::isnan(halfToFloat(narrowed[i]))) << set.name;
      } else {
        EXPECT_EQ(narrowed[i], floatToHalf(floats[i])) << set.name << " " << floats[i];
      }
    }
  }
  // The public entry points use the selected set.
  std::vector<uint16_t> out(floats.size());
  convertToHalf(floats.data(), out.data(), floats.size());
  std::vector<float> back(out.size());
  convertFromHalf(out.data(), back.data(), out.size());
  for (size_t i = 0; i < floats.size(); ++i) {
    if (!std::isnan(floats[i])) {
      EXPECT_EQ(back[i], halfToFloat(floatToHalf(floats[i])));
    }
  }
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
