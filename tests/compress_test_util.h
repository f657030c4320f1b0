// Helpers of the codec tests (compress_test.cpp, momentum_correction_test.cpp): gradient-like
// data and bitwise comparison.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace shoal::compress::test {

// n draws of N(0, sigma), the same for the same seed.
inline std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Equal bits: tells -0 from 0 and compares NaN with itself.
inline bool sameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

}  // namespace shoal::compress::test
