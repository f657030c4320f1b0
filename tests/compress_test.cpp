// The gradient-compression codecs of comm/compress/ on raw buffers: the spec's grammar, the
// 16-bit casts' rounding, top-k's and 1-bit's messages, and their error feedback (what is not
// sent is kept, so nothing is lost over steps). Messages from peers are checked before use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "comm/compress/half_cast.h"
#include "comm/compress/sign.h"
#include "comm/compress/spec.h"
#include "comm/compress/topk.h"
#include "common/error.h"
#include "common/half.h"
#include "tests/compress_test_util.h"

namespace shoal::compress {
namespace {

using test::normal;
using test::sameBits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The message of the exception of type E that `fn` throws ("" if it throws nothing; another
// type fails the test).
template <typename E, typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// ---- spec

void expectSameSpec(const CompressionSpec& a, const CompressionSpec& b, std::string_view text) {
  EXPECT_EQ(a.codec, b.codec) << text;
  EXPECT_EQ(a.density, b.density) << text;
  EXPECT_EQ(a.rank, b.rank) << text;
  EXPECT_EQ(a.momentum, b.momentum) << text;
  EXPECT_EQ(a.denseElements, b.denseElements) << text;
  EXPECT_EQ(a.warmupSteps, b.warmupSteps) << text;
}

TEST(CompressSpec, ParsesEveryCodecWithItsDefaults) {
  EXPECT_EQ(CompressionSpec::parse("none").codec, Codec::kNone);
  EXPECT_FALSE(CompressionSpec::parse("none").enabled());
  EXPECT_EQ(CompressionSpec::parse("fp16").codec, Codec::kFp16);
  EXPECT_EQ(CompressionSpec::parse("bf16").codec, Codec::kBf16);
  EXPECT_EQ(CompressionSpec::parse("onebit").codec, Codec::kOneBit);
  const auto topk = CompressionSpec::parse("topk");
  EXPECT_EQ(topk.codec, Codec::kTopK);
  EXPECT_EQ(topk.density, 0.01);
  EXPECT_TRUE(topk.enabled());
  EXPECT_EQ(CompressionSpec::parse("topk:0.25").density, 0.25);
  EXPECT_EQ(CompressionSpec::parse("topk:1").density, 1.0);
  const auto psgd = CompressionSpec::parse("powersgd");
  EXPECT_EQ(psgd.codec, Codec::kPowerSgd);
  EXPECT_EQ(psgd.rank, 4);
  EXPECT_EQ(CompressionSpec::parse("powersgd:1024").rank, 1024);
  const auto warm = CompressionSpec::parse("powersgd:2,warmup=50");
  EXPECT_EQ(warm.rank, 2);
  EXPECT_EQ(warm.warmupSteps, 50);
  EXPECT_EQ(CompressionSpec::parse("fp16,warmup=7").warmupSteps, 7);
  EXPECT_EQ(topk.momentum, 0.0);
  const auto dgc = CompressionSpec::parse("topk:0.01,momentum=0.9,warmup=2");
  EXPECT_EQ(dgc.codec, Codec::kTopK);
  EXPECT_EQ(dgc.momentum, 0.9);
  EXPECT_EQ(dgc.warmupSteps, 2);
  EXPECT_EQ(CompressionSpec::parse("onebit,warmup=3,momentum=0.5").momentum, 0.5);
  EXPECT_EQ(topk.denseElements, 0);
  EXPECT_EQ(CompressionSpec::parse("topk:0.01,dense=65536").denseElements, 65536);
  EXPECT_EQ(CompressionSpec::parse("onebit,dense=1").denseElements, 1);
}

TEST(CompressSpec, PrintsCanonicalTextThatParsesBackToTheSameSpec) {
  const std::pair<const char*, const char*> cases[] = {
      {"none", "none"},
      {"fp16", "fp16"},
      {"bf16,warmup=3", "bf16,warmup=3"},
      {"onebit", "onebit"},
      {"topk", "topk:0.01"},
      {"topk:+0.5", "topk:0.5"},
      {"topk:1e-5", "topk:1e-05"},
      {"topk:0.30000000000000004", "topk:0.30000000000000004"},
      {"topk:0.01,warmup=50", "topk:0.01,warmup=50"},
      {"powersgd", "powersgd:4"},
      {"powersgd:16,warmup=0", "powersgd:16"},
      {"onebit,warmup=9223372036854775807", "onebit,warmup=9223372036854775807"},
      {"topk:0.01,warmup=2,momentum=0.9", "topk:0.01,momentum=0.9,warmup=2"},
      {"onebit,momentum=0.999", "onebit,momentum=0.999"},
      {"topk,momentum=0", "topk:0.01"},
      {"topk:0.01,warmup=2,dense=65536,momentum=0.9",
       "topk:0.01,momentum=0.9,dense=65536,warmup=2"},
      {"onebit,dense=0", "onebit"},
  };
  for (const auto& [text, canonical] : cases) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    EXPECT_EQ(spec.toString(), canonical) << text;
    expectSameSpec(CompressionSpec::parse(spec.toString()), spec, text);
  }
  EXPECT_EQ(toString(Codec::kPowerSgd), "powersgd");
  EXPECT_EQ(toString(static_cast<Codec>(200)), "invalid");
}

TEST(CompressSpec, RefusesBadTextInOneLineNamingItAndWhatIsAccepted) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "unknown codec ''"},
      {"gzip", "unknown codec 'gzip'"},
      {"FP16", "unknown codec 'FP16'"},
      {" topk", "unknown codec ' topk'"},
      {"topk:0", "topk density='0': expected a number in (0, 1]"},
      {"topk:-0.1", "topk density='-0.1'"},
      {"topk:1.5", "topk density='1.5': expected a number in (0, 1]"},
      {"topk:nan", "topk density='nan'"},
      {"topk:inf", "topk density='inf'"},
      {"topk:0.1x", "topk density='0.1x'"},
      {"topk:0.1 ", "topk density='0.1 '"},
      {"topk:", "topk density=''"},
      {"powersgd:0", "powersgd rank='0': expected an integer from 1 to 1024"},
      {"powersgd:1025", "powersgd rank='1025'"},
      {"powersgd:2.5", "powersgd rank='2.5'"},
      {"powersgd:", "powersgd rank=''"},
      {"fp16:3", "fp16 takes no parameter (':3')"},
      {"none:1", "none takes no parameter"},
      {"onebit:2", "onebit takes no parameter"},
      {"bf16:", "bf16 takes no parameter"},
      {"topk,warmup=-1", "warmup='-1': expected an integer from 0"},
      {"topk,warmup=", "warmup=''"},
      {"topk,warmup", "warmup=''"},
      {"topk,warmup=5x", "warmup='5x'"},
      {"topk,warmup=99999999999999999999", "warmup='99999999999999999999'"},
      {"topk,warmup=5,warmup=6", "warmup given twice"},
      {"topk,speed=3", "unknown option 'speed=3'"},
      {"topk,", "unknown option ''"},
      {"topk,warmup=5,", "unknown option ''"},
      {"topk:0.1:0.2", "topk density='0.1:0.2'"},
      {"topk,momentum=1", "momentum='1': expected a number in [0, 1)"},
      {"topk,momentum=-0.1", "momentum='-0.1': expected a number in [0, 1)"},
      {"topk,momentum=0.9x", "momentum='0.9x'"},
      {"topk,momentum=nan", "momentum='nan'"},
      {"topk,momentum=", "momentum=''"},
      {"onebit,momentum", "momentum=''"},
      {"topk,momentum=0.9,warmup=2,momentum=0.9", "momentum given twice"},
      {"fp16,momentum=0.9", "momentum is top-k's and 1-bit's (momentum correction), not fp16's"},
      {"bf16,momentum=0.9", "not bf16's"},
      {"powersgd:4,momentum=0.9", "not powersgd's"},
      {"none,momentum=0.5", "not none's"},
      {"topk,dense=-1", "dense='-1': expected an integer from 0"},
      {"topk,dense=1.5", "dense='1.5'"},
      {"topk,dense=", "dense=''"},
      {"onebit,dense", "dense=''"},
      {"topk,dense=5,dense=5", "dense given twice"},
      {"fp16,dense=100", "dense is top-k's and 1-bit's, not fp16's"},
      {"powersgd:2,dense=100", "not powersgd's"},
  };
  for (const auto& [text, reason] : cases) {
    const std::string what =
        errorOf<InvalidArgument>([&, text = text] { CompressionSpec::parse(text); });
    EXPECT_NE(what.find(fmt::format("compression '{}': ", text)), std::string::npos)
        << text << ": " << what;
    EXPECT_NE(what.find(reason), std::string::npos) << text << ": " << what;
    EXPECT_NE(what.find("expected none, fp16, bf16, topk[:DENSITY], powersgd[:RANK] or onebit"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// ---- casts

std::vector<float> logUniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> e(std::log2(lo), std::log2(hi));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(e(rng)));
  return v;
}

// The largest relative error of casting `in` to `half` and back.
double roundTripError(DataType half, const std::vector<float>& in) {
  std::vector<uint16_t> wire(in.size());
  std::vector<float> back(in.size());
  encodeHalf(half, in.data(), wire.data(), in.size());
  decodeHalf(half, wire.data(), back.data(), in.size());
  double worst = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(back[i]) - in[i]) / std::abs(in[i]));
  }
  return worst;
}

TEST(CompressCast, Fp16RoundTripIsWithinHalfAnUlpInTheNormalRange) {
  // float16's normal range is [2^-14, 65504]; 11 significant bits, rounded to nearest.
  const auto in = logUniform(100003, 1, 6.2e-5f, 65504.0f);
  const double err = roundTripError(DataType::kFloat16, in);
  EXPECT_LE(err, std::ldexp(1.0, -11));
  EXPECT_GT(err, std::ldexp(1.0, -13));  // the cast did round: this is not float32 passing by
}

TEST(CompressCast, Bf16RoundTripIsWithinHalfAnUlpOverFloat32sRange) {
  const auto in = logUniform(100003, 2, 1e-37f, 1e38f);
  const double err = roundTripError(DataType::kBFloat16, in);
  EXPECT_LE(err, std::ldexp(1.0, -8));
  EXPECT_GT(err, std::ldexp(1.0, -10));
}

TEST(CompressCast, Fp16OverflowsToInfinityAndKeepsNaN) {
  const std::vector<float> in = {
      65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f, kInf, -kInf, kNaN, std::ldexp(1.0f, -24),
      0.0f,     -0.0f};
  std::vector<uint16_t> wire(in.size());
  std::vector<float> out(in.size());
  encodeHalf(DataType::kFloat16, in.data(), wire.data(), in.size());
  decodeHalf(DataType::kFloat16, wire.data(), out.data(), in.size());
  EXPECT_EQ(out[0], 65504.0f);
  EXPECT_EQ(out[1], 65504.0f);  // below the midpoint to the next (absent) value 65536
  EXPECT_EQ(out[2], kInf);
  EXPECT_EQ(out[3], kInf);
  EXPECT_EQ(out[4], -kInf);
  EXPECT_EQ(out[5], kInf);
  EXPECT_EQ(out[6], -kInf);
  EXPECT_TRUE(std::isnan(out[7]));
  EXPECT_EQ(out[8], std::ldexp(1.0f, -24));  // the smallest subnormal survives
  EXPECT_TRUE(sameBits(out[9], 0.0f));
  EXPECT_TRUE(sameBits(out[10], -0.0f));
}

TEST(CompressCast, Bf16KeepsInfinityAndNaN) {
  const std::vector<float> in = {kInf, -kInf, kNaN, -kNaN, 1e38f, -0.0f};
  std::vector<uint16_t> wire(in.size());
  std::vector<float> out(in.size());
  encodeHalf(DataType::kBFloat16, in.data(), wire.data(), in.size());
  decodeHalf(DataType::kBFloat16, wire.data(), out.data(), in.size());
  EXPECT_EQ(out[0], kInf);
  EXPECT_EQ(out[1], -kInf);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_TRUE(std::isfinite(out[4]));
  EXPECT_TRUE(sameBits(out[5], -0.0f));
}

TEST(CompressCast, BufferCastsMatchTheOneValueConvertersOnEveryBitPattern) {
  // Random bit patterns (NaNs, subnormals, infinities included) and a length that leaves a
  // tail after the vector loop.
  std::mt19937 rng(3);
  const size_t n = 65536 + 7;
  std::vector<float> in(n);
  for (float& f : in) {
    const uint32_t u = rng();
    std::memcpy(&f, &u, sizeof(f));
  }
  for (DataType half : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint16_t> wire(n);
    encodeHalf(half, in.data(), wire.data(), n);
    std::vector<uint16_t> patterns(n);
    std::iota(patterns.begin(), patterns.end(), uint16_t{0});
    std::vector<float> back(n);
    decodeHalf(half, patterns.data(), back.data(), n);
    const bool fp16 = half == DataType::kFloat16;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(wire[i], fp16 ? floatToHalf(in[i]) : floatToBf16(in[i])) << i;
      const float one = fp16 ? halfToFloat(patterns[i]) : bf16ToFloat(patterns[i]);
      ASSERT_TRUE(sameBits(back[i], one)) << i;
    }
  }
}

TEST(CompressCast, RefusesTypesThatAreNotSixteenBitFloats) {
  float f = 1;
  uint16_t h = 0;
  for (DataType t : {DataType::kFloat32, DataType::kInt32, static_cast<DataType>(99)}) {
    EXPECT_NE(errorOf<InvalidArgument>([&] {
                encodeHalf(t, &f, &h, 1);
              }).find("is not a 16-bit float type"),
              std::string::npos);
    EXPECT_NE(errorOf<InvalidArgument>([&] { decodeHalf(t, &h, &f, 1); }), "");
  }
}

// ---- top-k

struct TopK {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

TopK readTopK(const std::vector<uint8_t>& message, size_t k) {
  TopK m{std::vector<uint32_t>(k), std::vector<float>(k)};
  std::memcpy(m.indices.data(), message.data(), k * sizeof(uint32_t));
  std::memcpy(m.values.data(), message.data() + k * sizeof(uint32_t), k * sizeof(float));
  return m;
}

std::vector<uint8_t> topkMessage(const std::vector<uint32_t>& indices,
                                 const std::vector<float>& values) {
  std::vector<uint8_t> m(topkMessageBytes(indices.size()));
  std::memcpy(m.data(), indices.data(), indices.size() * sizeof(uint32_t));
  std::memcpy(m.data() + indices.size() * sizeof(uint32_t), values.data(),
              values.size() * sizeof(float));
  return m;
}

// Encodes with a residual and checks the message and the residual against a reference: the k
// first of the indices sorted by |e| (NaN above infinity) descending, then index ascending.
void checkTopK(const std::vector<float>& grad, std::vector<float> residual, size_t k) {
  const size_t n = grad.size();
  std::vector<float> e(n);
  for (size_t i = 0; i < n; ++i) e[i] = grad[i] + residual[i];
  const std::vector<float> gradBefore = grad;
  std::vector<uint8_t> message(topkMessageBytes(k));
  topkEncode(grad.data(), residual.data(), n, k, message.data());
  const TopK m = readTopK(message, k);

  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const bool nanA = std::isnan(e[a]), nanB = std::isnan(e[b]);
    if (nanA != nanB) return nanA;
    return !nanA && std::abs(e[a]) > std::abs(e[b]);
  });
  std::vector<uint32_t> expected(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(m.indices, expected) << "n " << n << " k " << k;

  std::vector<bool> sent(n, false);
  for (size_t j = 0; j < k; ++j) {
    sent[m.indices[j]] = true;
    EXPECT_TRUE(sameBits(m.values[j], e[m.indices[j]])) << j;
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(sameBits(residual[i], sent[i] ? 0.0f : e[i])) << i;
  }
  EXPECT_EQ(std::memcmp(grad.data(), gradBefore.data(), n * sizeof(float)), 0);  // NaN too
}

TEST(CompressTopK, CountIsTheCeilingOfTheFractionAtLeastOne) {
  EXPECT_EQ(topkCount(0, 0.5), 0u);
  EXPECT_EQ(topkCount(0, 1), 0u);
  EXPECT_EQ(topkCount(10, 1), 10u);
  EXPECT_EQ(topkCount(1000, 1e-9), 1u);
  EXPECT_EQ(topkCount(1, 1e-300), 1u);
  EXPECT_EQ(topkCount(3, 0.5), 2u);
  EXPECT_EQ(topkCount(101, 0.01), 2u);
  EXPECT_EQ(topkCount(100, 0.07), 7u);  // not 8: 100 * 0.07 is 7.000000000000001 in double
  EXPECT_EQ(topkCount(10000000, 0.01), 100000u);
  for (double bad : {0.0, -0.5, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_NE(errorOf<InvalidArgument>([&] { topkCount(10, bad); }), "") << bad;
  }
}

TEST(CompressTopK, SendsExactlyTheKLargestAscendingAndKeepsTheRestInTheResidual) {
  for (size_t n : {1u, 7u, 1000u, 100003u}) {
    for (double density : {1e-4, 0.01, 0.3, 1.0}) {
      checkTopK(normal(n, 10 + static_cast<uint32_t>(n)), normal(n, 20, 0.1f),
                topkCount(n, density));
    }
  }
}

TEST(CompressTopK, TiesGoToTheLowerIndex) {
  // Few distinct magnitudes, both signs: the threshold falls inside a run of equal |e|.
  std::mt19937 rng(4);
  std::vector<float> grad(5000), zero(5000, 0.0f);
  for (float& g : grad) g = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  for (size_t k : {1u, 10u, 700u, 2345u, 4999u}) checkTopK(grad, zero, k);
  // All equal (one histogram bucket holds everything): the first k.
  std::vector<float> ones(3000, 1.0f);
  ones[17] = -1.0f;
  checkTopK(ones, zero, 20);
  std::vector<uint8_t> message(topkMessageBytes(3));
  topkEncode(ones.data(), nullptr, ones.size(), 3, message.data());
  EXPECT_EQ(readTopK(message, 3).indices, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(CompressTopK, NonFiniteValuesAreSentFirst) {
  std::vector<float> grad = normal(100, 5);
  grad[70] = kNaN;
  grad[7] = kInf;
  grad[3] = -kInf;
  grad[50] = 1e30f;
  checkTopK(grad, std::vector<float>(100, 0.0f), 4);
  std::vector<uint8_t> message(topkMessageBytes(3));
  topkEncode(grad.data(), nullptr, grad.size(), 3, message.data());
  EXPECT_EQ(readTopK(message, 3).indices, (std::vector<uint32_t>{3, 7, 70}));
}

TEST(CompressTopK, KOfZeroOnlyAddsTheGradientAndKAboveNIsRefused) {
  std::vector<float> grad = {1, -2, 3}, residual = {0.5f, 0.5f, 0.5f};
  topkEncode(grad.data(), residual.data(), 3, 0, nullptr);
  EXPECT_EQ(residual, (std::vector<float>{1.5f, -1.5f, 3.5f}));
  uint8_t message[64];
  EXPECT_NE(errorOf<InvalidArgument>([&] { topkEncode(grad.data(), nullptr, 3, 4, message); }), "");
  topkEncode(nullptr, nullptr, 0, 0, nullptr);  // an empty bucket
}

// Runs `steps` steps of random gradients through encode and accumulate. Returns the largest
// |sum of gradients - (sum of decoded messages + final residual)| and the largest |sum of
// gradients| over the elements.
template <typename Step>
std::pair<double, double> feedbackLoss(size_t n, int steps, bool feedback, Step&& step) {
  std::vector<double> sumGrad(n, 0);
  std::vector<float> received(n, 0), residual(n, 0);
  for (int t = 0; t < steps; ++t) {
    const std::vector<float> grad = normal(n, 100 + static_cast<uint32_t>(t));
    for (size_t i = 0; i < n; ++i) sumGrad[i] += grad[i];
    step(grad.data(), feedback ? residual.data() : nullptr, received.data());
  }
  double loss = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    loss = std::max(loss, std::abs(sumGrad[i] - received[i] - residual[i]));
    scale = std::max(scale, std::abs(sumGrad[i]));
  }
  return {loss, scale};
}

TEST(CompressTopK, ErrorFeedbackLosesNothingOverSteps) {
  const size_t n = 4099, k = topkCount(n, 0.01);
  auto step = [&](const float* grad, float* residual, float* received) {
    std::vector<uint8_t> message(topkMessageBytes(k));
    topkEncode(grad, residual, n, k, message.data());
    topkAccumulate(message.data(), k, 1.0f, received, n);
  };
  const auto [loss, scale] = feedbackLoss(n, 60, true, step);
  EXPECT_LT(loss, 1e-4) << "of " << scale;
  // Without the residual, what was not sent is gone: most of the sum.
  const auto [lost, scale2] = feedbackLoss(n, 60, false, step);
  EXPECT_GT(lost, 0.5 * scale2);
}

TEST(CompressTopK, AccumulateAppliesTheWeight) {
  const auto message = topkMessage({0, 3, 9}, {2.0f, -4.0f, kInf});
  std::vector<float> out(10, 1.0f);
  topkAccumulate(message.data(), 3, 0.25f, out.data(), out.size());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 1, 1, 0, 1, 1, 1, 1, 1, kInf}));
  const auto nan = topkMessage({4}, {kNaN});
  topkAccumulate(nan.data(), 1, 1.0f, out.data(), out.size());
  EXPECT_TRUE(std::isnan(out[4]));  // the optimizer decides what a NaN gradient means
  topkAccumulate(nullptr, 0, 1.0f, out.data(), out.size());
}

TEST(CompressTopK, AccumulateRefusesBadIndicesWithoutWritingAnything) {
  const std::pair<std::vector<uint32_t>, const char*> cases[] = {
      {{1, 2, 5, 10}, "index 10 at position 3 of 4 is out of range for 10 elements"},
      {{4294967295u}, "index 4294967295 at position 0 of 1 is out of range"},
      {{1, 5, 5, 7}, "index 5 at position 2 of 4 does not ascend (after 5)"},
      {{3, 2}, "index 2 at position 1 of 2 does not ascend (after 3)"},
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9}, "position 10"},
  };
  for (const auto& [indices, reason] : cases) {
    const auto message = topkMessage(indices, std::vector<float>(indices.size(), 1.0f));
    std::vector<float> out(10, 0.5f);
    const std::string what = errorOf<ProtocolError>(
        [&] { topkAccumulate(message.data(), indices.size(), 1.0f, out.data(), out.size()); });
    EXPECT_NE(what.find(reason), std::string::npos) << what;
    EXPECT_EQ(out, std::vector<float>(10, 0.5f)) << reason;
  }
}

// ---- 1-bit

TEST(CompressSign, HandExampleBitsScaleAndResidual) {
  // n = 10: one full byte and two bits of the next. 0 and -0 count as +.
  const std::vector<float> grad = {0.5f, -1.5f, 0.0f, -0.0f, 2.0f, -1.0f, 3.0f, -4.0f, 1.0f, -1.0f};
  std::vector<float> residual(10, 0.0f);
  residual[9] = -0.5f;  // e[9] = -1.5
  std::vector<uint8_t> message(signMessageBytes(10));
  ASSERT_EQ(message.size(), 6u);
  signEncode(grad.data(), residual.data(), 10, message.data());
  float scale;
  std::memcpy(&scale, message.data(), sizeof(scale));
  EXPECT_EQ(scale, 1.45f);            // (0.5 + 1.5 + 0 + 0 + 2 + 1 + 3 + 4 + 1 + 1.5) / 10
  EXPECT_EQ(message[4], 0b01011101);  // + - + + + - + -, bit i is element i
  EXPECT_EQ(message[5], 0b01);        // + -, the unused bits 0
  const std::vector<float> e = {0.5f, -1.5f, 0.0f, -0.0f, 2.0f, -1.0f, 3.0f, -4.0f, 1.0f, -1.5f};
  for (size_t i = 0; i < 10; ++i) {
    const float sign = ((message[4 + i / 8] >> (i % 8)) & 1) ? 1.0f : -1.0f;
    EXPECT_EQ(residual[i], e[i] - sign * scale) << i;
  }
  std::vector<float> out(10, 1.0f);
  signAccumulate(message.data(), 10, 2.0f, out.data());
  EXPECT_EQ(out[0], 1 + 2 * 1.45f);
  EXPECT_EQ(out[1], 1 - 2 * 1.45f);
  EXPECT_EQ(out[3], 1 + 2 * 1.45f);
  EXPECT_EQ(out[9], 1 - 2 * 1.45f);

  // Without a residual, the same bits and scale of grad alone; grad untouched.
  signEncode(grad.data(), nullptr, 10, message.data());
  std::memcpy(&scale, message.data(), sizeof(scale));
  EXPECT_EQ(scale, 1.4f);
  EXPECT_EQ(message[4], 0b01011101);
  EXPECT_EQ(message[5], 0b01);
}

TEST(CompressSign, DecodedPlusResidualIsTheInput) {
  for (size_t n : {1u, 8u, 13u, 4096u, 100001u}) {
    const std::vector<float> grad = normal(n, 30 + static_cast<uint32_t>(n));
    std::vector<float> residual = normal(n, 40, 0.3f), e(n);
    for (size_t i = 0; i < n; ++i) e[i] = grad[i] + residual[i];
    std::vector<uint8_t> message(signMessageBytes(n));
    signEncode(grad.data(), residual.data(), n, message.data());
    float scale;
    std::memcpy(&scale, message.data(), sizeof(scale));
    double mean = 0;
    for (float v : e) mean += std::abs(v);
    EXPECT_NEAR(scale, mean / n, 1e-6 * mean / n) << n;
    std::vector<float> decoded(n, 0.0f);
    signAccumulate(message.data(), n, 1.0f, decoded.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(decoded[i], e[i] >= 0 ? scale : -scale) << i;
      ASSERT_NEAR(decoded[i] + residual[i], e[i], 1e-6f * (std::abs(e[i]) + scale)) << i;
    }
    if (n % 8 != 0) {
      EXPECT_EQ(message.back() >> (n % 8), 0) << "unused bits are 0";
    }
  }
}

TEST(CompressSign, ErrorFeedbackLosesNothingOverSteps) {
  const size_t n = 1003;
  auto step = [&](const float* grad, float* residual, float* received) {
    std::vector<uint8_t> message(signMessageBytes(n));
    signEncode(grad, residual, n, message.data());
    signAccumulate(message.data(), n, 1.0f, received);
  };
  const auto [loss, scale] = feedbackLoss(n, 60, true, step);
  EXPECT_LT(loss, 1e-4) << "of " << scale;
  const auto [lost, scale2] = feedbackLoss(n, 60, false, step);
  EXPECT_GT(lost, 0.5 * scale2);
}

TEST(CompressSign, AccumulateRefusesAScaleThatIsNotAFiniteMagnitude) {
  for (float bad : {kInf, -kInf, kNaN, -1.0f}) {
    std::vector<uint8_t> message(signMessageBytes(9), 0xff);
    std::memcpy(message.data(), &bad, sizeof(bad));
    std::vector<float> out(9, 0.5f);
    const std::string what =
        errorOf<ProtocolError>([&] { signAccumulate(message.data(), 9, 1.0f, out.data()); });
    EXPECT_NE(what.find("one-bit message: scale"), std::string::npos) << bad << ": " << what;
    EXPECT_EQ(out, std::vector<float>(9, 0.5f));
  }
  // A NaN gradient gives such a message: peers refuse it rather than spread NaN as a scale.
  const std::vector<float> grad = {1.0f, kNaN, 2.0f};
  std::vector<uint8_t> message(signMessageBytes(3));
  signEncode(grad.data(), nullptr, 3, message.data());
  std::vector<float> out(3, 0.0f);
  EXPECT_THROW(signAccumulate(message.data(), 3, 1.0f, out.data()), ProtocolError);
  // An empty bucket: scale 0, no bits.
  signEncode(nullptr, nullptr, 0, message.data());
  signAccumulate(message.data(), 0, 1.0f, nullptr);
}

}  // namespace
}  // namespace shoal::compress
