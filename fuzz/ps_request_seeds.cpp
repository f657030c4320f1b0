// The ps_request target's seeds (fuzz/ps_request_model.h), made with the workers' own encoder.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/ps_request_model.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"

namespace shoal::fuzz {

std::vector<std::pair<std::string, std::string>> psRequestSeeds() {
  using namespace ps;
  const Partition p = psRequestPartition();
  const auto& keys = p.keys();
  std::vector<std::pair<std::string, std::string>> seeds;
  auto request = [&](RequestKind kind, int key) {
    Request rq;
    rq.kind = static_cast<uint32_t>(kind);
    rq.key = key;
    rq.dtype = static_cast<uint8_t>(DataType::kFloat32);
    if (key != kAllKeys) {
      rq.ndim = static_cast<uint8_t>(keys[key].shape.size());
      std::copy(keys[key].shape.begin(), keys[key].shape.end(), rq.shape);
    }
    return rq;
  };
  auto add = [&](const std::string& name, int server, const Request& rq,
                 const std::string& payload) {
    seeds.emplace_back(name, std::string(1, static_cast<char>(server)) +
                                 std::string(reinterpret_cast<const char*>(&rq), sizeof(rq)) +
                                 payload);
  };
  // A push (or push-pull) of every piece on `server`, or of the key's, in `codec`.
  auto push = [&](const std::string& name, int server, int key, const std::string& codec,
                  RequestKind kind, Encoding pull) {
    Request rq = request(kind, key);
    std::vector<Piece> pieces;
    for (const Piece& q : p.pieces(server)) {
      if (key == kAllKeys || q.key == key) pieces.push_back(q);
    }
    size_t n = 0;
    for (const Piece& q : pieces) n += q.count;
    std::vector<float> grad(n);
    for (size_t i = 0; i < n; ++i) grad[i] = std::sin(0.7f * static_cast<float>(i)) * 0.1f;
    std::string payload(reinterpret_cast<const char*>(grad.data()), n * sizeof(float));
    if (codec != "none") {
      const auto spec = compress::CompressionSpec::parse(codec);
      PushEncoder encoder(spec, p);
      rq.encoding = static_cast<uint8_t>(pushEncoding(spec));
      rq.density = spec.density;
      std::vector<uint8_t> out;
      encoder.encode(pushEncoding(spec), pieces, grad.data(), out);
      payload.assign(out.begin(), out.end());
    }
    rq.bytes = payload.size();
    if (kind == RequestKind::kPushPull) {
      rq.pullEncoding = static_cast<uint8_t>(pull);
      rq.pullBytes = pullPayloadBytes(rq.pullEncoding, n);
    }
    add(name, server, rq, payload);
  };
  push("raw_key", 0, 0, "none", RequestKind::kPush, Encoding::kRaw);
  push("topk_shard", 0, kAllKeys, "topk:0.25", RequestKind::kPush, Encoding::kRaw);
  push("onebit_split_key", 1, 3, "onebit", RequestKind::kPush, Encoding::kRaw);
  push("fp16_pushpull_shard", 1, kAllKeys, "fp16", RequestKind::kPushPull, Encoding::kFp16);
  push("bf16_state", 0, 2, "bf16", RequestKind::kPushPull, Encoding::kRaw);
  Request pull = request(RequestKind::kPull, 4);
  pull.pullEncoding = static_cast<uint8_t>(Encoding::kFp16);
  pull.pullBytes = pullPayloadBytes(pull.pullEncoding, keys[4].numel());
  add("pull_fp16", 1, pull, "");
  return seeds;
}

}  // namespace shoal::fuzz
