// Momentum correction around the top-k and 1-bit codecs (comm/compress/momentum_correction.h):
// masking zeroes exactly the sent elements of both accumulators and nothing else; the velocities
// are conserved (sent + held = every step's velocity); against heavy-ball SGD, 1-bit loses
// nothing and top-k loses exactly the momentum tail of the velocities it masked.
#include "comm/compress/momentum_correction.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/compress/sign.h"
#include "comm/compress/topk.h"
#include "tests/compress_test_util.h"

namespace shoal::compress {
namespace {

using test::normal;
using test::sameBits;

std::vector<uint32_t> sentIndices(const std::vector<uint8_t>& message, size_t k) {
  std::vector<uint32_t> indices(k);
  std::memcpy(indices.data(), message.data(), k * sizeof(uint32_t));
  return indices;
}

TEST(MomentumCorrection, UpdateIsHeavyBallsBuffer) {
  const std::vector<float> grad = {1, -2, 0.5f, 0};
  std::vector<float> velocity = {0, 1, -1, 4};
  momentumUpdate(grad.data(), velocity.data(), grad.size(), 0.5f);
  EXPECT_EQ(velocity, (std::vector<float>{1, -1.5f, 0, 2}));
  momentumUpdate(nullptr, nullptr, 0, 0.9f);  // an empty bucket
}

// One step from a state where neither accumulator is zero: the k largest |v + m u + g| are
// sent with exactly those values; both accumulators are zero there and nowhere else, where
// they hold exactly u' = m u + g and v + u'.
TEST(MomentumCorrection, TopKMaskingZeroesExactlyTheSentElementsOfBoth) {
  const size_t n = 5000;
  const float m = 0.9f;
  for (size_t k : {size_t{1}, size_t{50}, size_t{2500}}) {
    const std::vector<float> grad = normal(n, 1);
    std::vector<float> velocity = normal(n, 2, 0.5f), accumulation = normal(n, 3, 0.2f);
    std::vector<float> u(n), v(n);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * velocity[i] + grad[i];
      v[i] = accumulation[i] + u[i];
    }
    std::vector<uint8_t> message(topkMessageBytes(k));
    topkEncodeWithMomentum(grad.data(), velocity.data(), accumulation.data(), n, k, m,
                           message.data());

    // The k largest |v|, as topkEncode ranks them (no ties in normal data).
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return std::abs(v[a]) > std::abs(v[b]); });
    std::vector<uint32_t> expected(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
    std::sort(expected.begin(), expected.end());
    const auto indices = sentIndices(message, k);
    ASSERT_EQ(indices, expected) << "k " << k;

    std::vector<bool> sent(n, false);
    for (size_t j = 0; j < k; ++j) {
      sent[indices[j]] = true;
      float value;
      std::memcpy(&value, message.data() + (k + j) * sizeof(uint32_t), sizeof(value));
      EXPECT_TRUE(sameBits(value, v[indices[j]])) << j;
    }
    for (size_t i = 0; i < n; ++i) {
      if (sent[i]) {
        ASSERT_TRUE(sameBits(velocity[i], 0.0f) && sameBits(accumulation[i], 0.0f)) << i;
      } else {
        ASSERT_NE(velocity[i], 0.0f) << i;
        ASSERT_TRUE(sameBits(velocity[i], u[i])) << i;
        ASSERT_TRUE(sameBits(accumulation[i], v[i])) << i;
      }
    }
  }
}

// At density 1 every element is sent and masked each step: what is sent is the gradient itself,
// plain SGD (no momentum survives masking), and both accumulators stay empty.
TEST(MomentumCorrection, TopKAtDensityOneIsPlainSgd) {
  const size_t n = 300;
  std::vector<float> velocity(n, 0.0f), accumulation(n, 0.0f);
  std::vector<uint8_t> message(topkMessageBytes(n));
  for (uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> grad = normal(n, 10 + step);
    topkEncodeWithMomentum(grad.data(), velocity.data(), accumulation.data(), n, n, 0.9f,
                           message.data());
    std::vector<float> received(n, 0.0f);
    topkAccumulate(message.data(), n, 1.0f, received.data(), n);
    EXPECT_EQ(received, grad) << "step " << step;
    EXPECT_EQ(velocity, std::vector<float>(n, 0.0f));
    EXPECT_EQ(accumulation, std::vector<float>(n, 0.0f));
  }
}

// Over many steps of random gradients, per element (in double):
//   conservation: sent + v = the sum of every step's velocity before masking
//   heavy-ball SGD's total, its future tail with no more gradients included, is
//   sum g / (1 - m); top-k falls short of it by exactly m / (1 - m) times the velocities it
//   masked, less the tail still due from the velocity it holds
//   an element never sent holds in v exactly heavy-ball SGD's distance so far
TEST(MomentumCorrection, TopKLosesOnlyTheMaskedVelocitiesTail) {
  const size_t n = 3000, k = topkCount(n, 0.01);
  const int steps = 25;
  const double m = 0.9;
  std::vector<float> velocity(n, 0.0f), accumulation(n, 0.0f);
  std::vector<double> sent(n, 0), velocities(n, 0), masked(n, 0), gradients(n, 0);
  std::vector<double> buffer(n, 0), heavyBall(n, 0);  // heavy-ball SGD at rate 1
  std::vector<bool> everSent(n, false);
  std::vector<uint8_t> message(topkMessageBytes(k));
  for (int t = 0; t < steps; ++t) {
    const std::vector<float> grad = normal(n, 100 + static_cast<uint32_t>(t));
    std::vector<float> before(n);  // this step's velocity before masking
    for (size_t i = 0; i < n; ++i) {
      before[i] = static_cast<float>(m) * velocity[i] + grad[i];
      velocities[i] += before[i];
      gradients[i] += grad[i];
      buffer[i] = m * buffer[i] + grad[i];
      heavyBall[i] += buffer[i];
    }
    topkEncodeWithMomentum(grad.data(), velocity.data(), accumulation.data(), n, k,
                           static_cast<float>(m), message.data());
    std::vector<float> received(n, 0.0f);
    topkAccumulate(message.data(), k, 1.0f, received.data(), n);
    for (uint32_t i : sentIndices(message, k)) {
      everSent[i] = true;
      masked[i] += before[i];
    }
    for (size_t i = 0; i < n; ++i) sent[i] += received[i];
  }
  size_t neverSent = 0;
  double lost = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    const double tol = 1e-4 * (1 + std::abs(velocities[i]));
    ASSERT_NEAR(sent[i] + accumulation[i], velocities[i], tol) << i;
    const double tail = m / (1 - m);
    ASSERT_NEAR(sent[i] + accumulation[i] + tail * (velocity[i] + masked[i]),
                gradients[i] / (1 - m), 10 * tol)
        << i;
    if (!everSent[i]) {
      ++neverSent;
      ASSERT_NEAR(accumulation[i], heavyBall[i], tol) << i;
    }
    lost += std::abs(tail * masked[i]);
    scale += std::abs(gradients[i] / (1 - m));
  }
  // Both kinds of element occur, and masking did drop something: the identities had content.
  EXPECT_GT(neverSent, n / 2);
  EXPECT_LT(neverSent, n);
  EXPECT_GT(lost, 1e-3 * scale);
}

// 1-bit empties no element, so nothing is masked: over the steps, what was sent plus what the
// accumulation holds is heavy-ball SGD's distance (rate 1), element by element.
TEST(MomentumCorrection, OneBitLosesNothingAgainstHeavyBallSgd) {
  const size_t n = 1003;
  const int steps = 40;
  const float m = 0.9f;
  std::vector<float> velocity(n, 0.0f), accumulation(n, 0.0f), received(n, 0.0f);
  std::vector<double> buffer(n, 0), heavyBall(n, 0);
  std::vector<uint8_t> message(signMessageBytes(n));
  for (int t = 0; t < steps; ++t) {
    const std::vector<float> grad = normal(n, 200 + static_cast<uint32_t>(t));
    for (size_t i = 0; i < n; ++i) {
      buffer[i] = m * buffer[i] + grad[i];
      heavyBall[i] += buffer[i];
    }
    signEncodeWithMomentum(grad.data(), velocity.data(), accumulation.data(), n, m, message.data());
    signAccumulate(message.data(), n, 1.0f, received.data());
  }
  double held = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(received[i] + accumulation[i], heavyBall[i], 1e-3 * (1 + std::abs(heavyBall[i])))
        << i;
    ASSERT_NEAR(velocity[i], buffer[i], 1e-4 * (1 + std::abs(buffer[i]))) << i;
    held += std::abs(accumulation[i]);
    scale += std::abs(heavyBall[i]);
  }
  EXPECT_GT(held, 1e-3 * scale) << "error feedback held nothing back: a trivial check";
}

}  // namespace
}  // namespace shoal::compress
