// The gradient-compression codecs (comm/compress/): the spec text a user writes, and top-k and
// 1-bit messages as a peer sends them.
//
// Input: 1 mode byte, then by mode % 3
//   0: the spec text;
//   1: top-k: 4 bytes weight, 2 bytes n (little-endian), then the message (k = bytes / 8);
//   2: 1-bit: 4 bytes weight, then the message (n = 8 * its bit bytes - mode / 3 % 8).
// For 1 and 2 the message's bytes are also encoded, as float32 gradients.
//
// Oracles: parse only throws InvalidArgument, in one line when the text has none, and what it
// accepts prints as text that parses back to the same spec; an accumulate either throws
// ProtocolError having written nothing or adds exactly weight * value where the message says;
// an encode's message is accepted by its own accumulate (top-k always, 1-bit when its scale is
// finite), decoded plus residual is the input, and top-k sends the k largest |e|.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/compress/sign.h"
#include "comm/compress/spec.h"
#include "comm/compress/topk.h"
#include "fuzz/fuzz_util.h"

using namespace shoal;
using namespace shoal::compress;

namespace {

constexpr const char* kTarget = "codec";

bool sameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}
bool sameValue(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// |v|'s bits: the order topkEncode ranks by (NaN above infinity).
uint32_t magnitudeKey(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

std::vector<float> floatsOf(const uint8_t* data, size_t size) {
  std::vector<float> v(size / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), data, v.size() * sizeof(float));
  return v;
}

template <typename E, typename F>
bool throws(F&& fn) {
  try {
    fn();
  } catch (const E&) {
    return true;
  } catch (const std::exception& e) {
    fuzz::finding(kTarget, e.what());
  }
  return false;
}

void spec(std::string_view text) {
  CompressionSpec s;
  try {
    s = CompressionSpec::parse(text);
  } catch (const InvalidArgument& e) {
    const std::string_view what = e.what();
    if (text.find('\n') == std::string_view::npos) {
      SHOAL_FUZZ_CHECK(kTarget, what.find('\n') == std::string_view::npos);
    }
    return;
  }
  const std::string canonical = s.toString();
  const CompressionSpec back = CompressionSpec::parse(canonical);
  SHOAL_FUZZ_CHECK(kTarget, back.codec == s.codec && back.warmupSteps == s.warmupSteps);
  SHOAL_FUZZ_CHECK(kTarget, back.density == s.density && back.rank == s.rank);
  SHOAL_FUZZ_CHECK(kTarget, back.momentum == s.momentum && back.denseElements == s.denseElements);
  SHOAL_FUZZ_CHECK(kTarget, back.toString() == canonical);
}

void topkMessage(float weight, size_t n, const uint8_t* message, size_t k) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(i);
  const std::vector<float> before = out;
  if (throws<ProtocolError>([&] { topkAccumulate(message, k, weight, out.data(), n); })) {
    SHOAL_FUZZ_CHECK(kTarget, out == before);  // no NaN in before: nothing was written
    return;
  }
  std::vector<float> expected = before;
  for (size_t j = 0; j < k; ++j) {
    uint32_t index;
    float value;
    std::memcpy(&index, message + j * sizeof(uint32_t), sizeof(index));
    std::memcpy(&value, message + k * sizeof(uint32_t) + j * sizeof(float), sizeof(value));
    SHOAL_FUZZ_CHECK(kTarget, index < n);
    if (j > 0) {
      uint32_t previous;
      std::memcpy(&previous, message + (j - 1) * sizeof(uint32_t), sizeof(previous));
      SHOAL_FUZZ_CHECK(kTarget, previous < index);
    }
    expected[index] += weight * value;
  }
  for (size_t i = 0; i < n; ++i) SHOAL_FUZZ_CHECK(kTarget, sameBits(out[i], expected[i]));
}

void topkRoundTrip(const std::vector<float>& grad, double density) {
  const size_t n = grad.size(), k = topkCount(n, density);
  std::vector<float> residual(n, 0.0f), decoded(n, 0.0f);
  std::vector<uint8_t> message(topkMessageBytes(k));
  topkEncode(grad.data(), residual.data(), n, k, message.data());
  topkAccumulate(message.data(), k, 1.0f, decoded.data(), n);  // ascending, in range
  std::vector<bool> sent(n, false);
  for (size_t j = 0; j < k; ++j) {
    uint32_t index;
    std::memcpy(&index, message.data() + j * sizeof(uint32_t), sizeof(index));
    sent[index] = true;
  }
  // e = grad + the zero residual: -0 becomes +0 and a signaling NaN a quiet one.
  std::vector<float> e(n);
  for (size_t i = 0; i < n; ++i) e[i] = 0.0f + grad[i];
  // The k sent have the largest keys; at the threshold key the lower indices were sent.
  uint32_t threshold = UINT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    if (sent[i]) threshold = std::min(threshold, magnitudeKey(e[i]));
  }
  bool keptAtThreshold = false;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = magnitudeKey(e[i]);
    if (sent[i]) {
      SHOAL_FUZZ_CHECK(kTarget, sameBits(residual[i], 0.0f) && sameValue(decoded[i], e[i]));
      SHOAL_FUZZ_CHECK(kTarget, !(key == threshold && keptAtThreshold));
    } else {
      SHOAL_FUZZ_CHECK(kTarget, sameBits(residual[i], e[i]) && sameBits(decoded[i], 0.0f));
      SHOAL_FUZZ_CHECK(kTarget, key <= threshold);
      keptAtThreshold = keptAtThreshold || key == threshold;
    }
  }
}

void signMessage(float weight, size_t n, const uint8_t* message) {
  float scale;
  std::memcpy(&scale, message, sizeof(scale));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(i);
  const std::vector<float> before = out;
  const bool refused =
      throws<ProtocolError>([&] { signAccumulate(message, n, weight, out.data()); });
  SHOAL_FUZZ_CHECK(kTarget, refused == !(std::isfinite(scale) && scale >= 0));
  const float plus = weight * scale;
  for (size_t i = 0; i < n; ++i) {
    const bool bit = (message[sizeof(float) + i / 8] >> (i % 8)) & 1;
    const float expected = refused ? before[i] : before[i] + (bit ? plus : -plus);
    SHOAL_FUZZ_CHECK(kTarget, sameBits(out[i], expected));
  }
}

void signRoundTrip(const std::vector<float>& grad) {
  const size_t n = grad.size();
  std::vector<float> residual(n, 0.0f), decoded(n, 0.0f);
  std::vector<uint8_t> message(signMessageBytes(n));
  signEncode(grad.data(), residual.data(), n, message.data());
  float scale;
  std::memcpy(&scale, message.data(), sizeof(scale));
  if (!std::isfinite(scale)) return;  // a NaN or infinite gradient: refused, checked above
  signAccumulate(message.data(), n, 1.0f, decoded.data());
  for (size_t i = 0; i < n; ++i) {
    const double e = grad[i], sum = static_cast<double>(decoded[i]) + residual[i];
    SHOAL_FUZZ_CHECK(kTarget, std::abs(sum - e) <= 1e-6 * (std::abs(e) + scale));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  if (mode % 3 == 0) {
    spec(std::string_view(reinterpret_cast<const char*>(data), size));
    return 0;
  }
  if (size < sizeof(float)) return 0;
  float weight;
  std::memcpy(&weight, data, sizeof(weight));
  data += sizeof(float);
  size -= sizeof(float);
  if (mode % 3 == 1) {
    if (size < 2) return 0;
    const size_t n = data[0] | (size_t{data[1]} << 8);
    topkMessage(weight, n, data + 2, (size - 2) / 8);
    const auto grad = floatsOf(data + 2, size - 2);
    topkRoundTrip(grad, (mode / 3 % 64 + 1) / 64.0);
    return 0;
  }
  if (size < sizeof(float)) return 0;
  const size_t bitBytes = size - sizeof(float);
  const size_t n = bitBytes == 0 ? 0 : 8 * bitBytes - mode / 3 % 8;
  signMessage(weight, n, data);
  signRoundTrip(floatsOf(data, size));
  return 0;
}
