// Note [Top-k selection]
// The k largest |e| of n (n ~ 10 M every step on every bucket) in two passes over the buffer:
//  1. e = grad + residual, written into the residual, and a histogram of the top 16 bits of
//     key(e) = the bits of |e| (sign cleared). For floats that are not NaN the order of these
//     keys as unsigned integers is the order of the magnitudes; NaN's keys are above infinity's,
//     so a NaN is always sent (the receiver's optimizer sees it) and the order stays total,
//     which std::nth_element needs. From the histogram, the bucket b holding the k-th largest
//     key and the count of keys in buckets above it.
//  2. The indices whose key is in bucket b or above, ascending: k plus the few that share
//     bucket b (1/256 of a binade), about k for gradient-like data.
// Then, on those candidates only, the k-th largest key T (std::nth_element over bucket b's keys)
// and one ascending walk emitting every key > T and the first (lowest-index) keys == T until k
// are emitted: exactly k elements, ties broken by lower index, indices ascending as the wire
// layout asks. Data whose keys mostly fall into one bucket (all equal) only makes the candidate
// list long: still correct, O(n) memory.
#include "comm/compress/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/error.h"

namespace shoal::compress {

namespace {

constexpr int kBucketShift = 15;  // keys are 31 bits: 2^16 buckets of the top 16
constexpr size_t kBuckets = size_t{1} << (31 - kBucketShift);
constexpr size_t kChunk = 4096;  // elements added before being histogrammed, still in L1

inline uint32_t keyOf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

inline uint32_t loadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float loadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

size_t topkCount(size_t n, double density) {
  if (!(density > 0 && density <= 1)) {
    SHOAL_THROW(InvalidArgument, "top-k density {}: expected a number in (0, 1]", density);
  }
  if (n == 0) return 0;
  // n * density carries the rounding of density's decimal text (100 * 0.07 is
  // 7.000000000000001): a product within 1e-12 of an integer is that integer, so "topk:0.07"
  // sends 7 of 100, not 8.
  const double x = static_cast<double>(n) * density;
  const double nearest = std::round(x);
  const double k = std::abs(x - nearest) <= 1e-12 * x ? nearest : std::ceil(x);
  return std::clamp(static_cast<size_t>(k), size_t{1}, n);
}

void topkEncode(const float* grad, float* residual, size_t n, size_t k, uint8_t* message) {
  SHOAL_CHECK_LE(k, n, "topkEncode: more elements to send than the buffer has");
  // Indices are uint32 on the wire, and so are the histogram's counts.
  SHOAL_CHECK_LT(n, size_t{1} << 32, "topkEncode: buffer too large for top-k");
  uint8_t* indexOut = message;
  uint8_t* valueOut = message + k * sizeof(uint32_t);

  // Pass 1: e, and the histogram of its keys' top bits (Note [Top-k selection]).
  const float* e = residual != nullptr ? residual : grad;
  std::vector<uint32_t> histogram(kBuckets, 0);
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t end = std::min(n, start + kChunk);
    if (residual != nullptr) {
      for (size_t i = start; i < end; ++i) residual[i] += grad[i];
    }
    for (size_t i = start; i < end; ++i) ++histogram[keyOf(e[i]) >> kBucketShift];
  }
  if (k == 0) return;

  size_t above = 0;  // keys in buckets above b
  size_t b = kBuckets - 1;
  while (above + histogram[b] < k) above += histogram[b--];

  // Pass 2: the candidates, ascending.
  std::vector<uint32_t> candidates;
  candidates.reserve(above + histogram[b]);
  const uint32_t lowest = static_cast<uint32_t>(b) << kBucketShift;
  for (size_t i = 0; i < n; ++i) {
    if (keyOf(e[i]) >= lowest) candidates.push_back(static_cast<uint32_t>(i));
  }

  // T, the k-th largest key: the (k - above)-th largest of bucket b's.
  std::vector<uint32_t> inBucket;
  inBucket.reserve(histogram[b]);
  for (uint32_t i : candidates) {
    if ((keyOf(e[i]) >> kBucketShift) == b) inBucket.push_back(keyOf(e[i]));
  }
  const size_t rank = k - above;  // 1 <= rank <= histogram[b]
  std::nth_element(inBucket.begin(), inBucket.begin() + static_cast<ptrdiff_t>(rank - 1),
                   inBucket.end(), std::greater<>());
  const uint32_t threshold = inBucket[rank - 1];
  size_t equalLeft =
      rank - static_cast<size_t>(std::count_if(inBucket.begin(), inBucket.end(),
                                               [&](uint32_t key) { return key > threshold; }));

  size_t j = 0;
  for (uint32_t i : candidates) {
    const uint32_t key = keyOf(e[i]);
    if (key < threshold || (key == threshold && equalLeft == 0)) continue;
    if (key == threshold) --equalLeft;
    std::memcpy(indexOut + j * sizeof(uint32_t), &i, sizeof(i));
    std::memcpy(valueOut + j * sizeof(float), &e[i], sizeof(float));
    if (residual != nullptr) residual[i] = 0;
    ++j;
  }
  SHOAL_ASSERT(j == k, "top-k emitted {} of {} elements", j, k);
}

void topkAccumulate(const uint8_t* message, size_t k, float weight, float* out, size_t n) {
  const uint8_t* values = message + k * sizeof(uint32_t);
  // The whole message is checked before anything is written: a bad message changes nothing.
  for (size_t j = 0; j < k; ++j) {
    const uint32_t index = loadU32(message + j * sizeof(uint32_t));
    if (index >= n) {
      SHOAL_THROW(ProtocolError,
                  "top-k message: index {} at position {} of {} is out of range for {} elements",
                  index, j, k, n);
    }
    if (j > 0) {
      const uint32_t previous = loadU32(message + (j - 1) * sizeof(uint32_t));
      if (index <= previous) {
        SHOAL_THROW(ProtocolError,
                    "top-k message: index {} at position {} of {} does not ascend (after {})",
                    index, j, k, previous);
      }
    }
  }
  for (size_t j = 0; j < k; ++j) {
    out[loadU32(message + j * sizeof(uint32_t))] += weight * loadF32(values + j * sizeof(float));
  }
}

}  // namespace shoal::compress
