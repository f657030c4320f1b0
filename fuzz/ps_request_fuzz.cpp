// A parameter-server request as its server checks it before receiving the payload, and a
// compressed push's payload as the server decodes it (ps/server_requests.cpp):
// checkEncodings, requestTarget (ps/request_target.h), checkPushBytes, decodePush for a
// compressed push, checkPullBytes and encodePull for a pull. The model is fixed
// (fuzz/ps_request_model.h): five keys over two servers, one of them cut between the two.
//
// Input: 1 mode byte (bit 0: the server, 0 or 1; bit 1: the request's version is set to this
// protocol's; bit 2: its payload size to what the push must carry; bit 3: its pull size to what
// the pull must carry: so that inputs get past the exact-size checks to the decoder), the
// Request header (ps/protocol.h), then the payload.
//
// Oracle: bad requests end in a typed error; what a request is granted lies inside the shard
// (pieces in range, end to end, as many elements as the target says); an accepted push carries
// exactly what its encoding needs; a decoded push writes only its target's floats (ASan: the
// buffer is exactly that large) and a raw piece of a state key comes out bit for bit; a pull's
// reply is the size the request said.
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/ps_request_model.h"
#include "ps/config.h"
#include "ps/payload_codec.h"
#include "ps/request_target.h"

using namespace shoal;
using namespace shoal::ps;

namespace {

constexpr const char* kTarget = "ps_request";

struct Model {
  Partition partition;
  Shard shards[2];
};

const Model& model() {
  static const Model m = [] {
    Partition p = fuzz::psRequestPartition();
    TrainingConfig config;
    return Model{p, {Shard(p, 0, 2, config), Shard(p, 1, 2, config)}};
  }();
  return m;
}

void checkTarget(const Model& m, int server, const Target& t) {
  const Shard& shard = m.shards[server];
  SHOAL_FUZZ_CHECK(kTarget, t.first < t.last || shard.pieceCount() == 0);
  SHOAL_FUZZ_CHECK(kTarget, t.last <= shard.pieceCount());
  SHOAL_FUZZ_CHECK(kTarget, t.offset + t.count <= shard.elements());
  size_t flat = shard.begin() + t.offset, n = 0;
  for (const Piece& p : targetPieces(m.partition, server, t)) {
    SHOAL_FUZZ_CHECK(kTarget, p.flat == flat && p.server == server);
    flat += p.count;
    n += p.count;
  }
  SHOAL_FUZZ_CHECK(kTarget, n == t.count);
}

// The decoded push of raw state pieces is their bytes (Note [Payload layout] in
// ps/payload_codec.h: a state piece travels raw whatever the encoding).
void checkStatePieces(const Model& m, std::span<const Piece> pieces, const Request& rq,
                      const uint8_t* payload, const std::vector<float>& out) {
  size_t at = 0, element = 0;
  for (const Piece& p : pieces) {
    const uint64_t bytes =
        pushPayloadBytes(rq.encoding, rq.density, std::span(&p, 1), m.partition.keys());
    if (m.partition.keys()[p.key].kind == KeyKind::kState) {
      SHOAL_FUZZ_CHECK(kTarget, bytes == p.count * sizeof(float));
      SHOAL_FUZZ_CHECK(kTarget, std::memcmp(payload + at, out.data() + element, bytes) == 0);
    }
    at += bytes;
    element += p.count;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + sizeof(Request)) return 0;
  const Model& m = model();
  const uint8_t mode = data[0];
  const int server = mode & 1;
  Request rq;
  std::memcpy(&rq, data + 1, sizeof(rq));
  if (mode & 2) rq.version = kProtocolVersion;
  const uint8_t* payload = data + 1 + sizeof(Request);
  const size_t payloadSize = size - 1 - sizeof(Request);
  const auto kind = static_cast<RequestKind>(rq.kind);
  const auto& keys = m.partition.keys();

  fuzz::expectTypedErrors(kTarget, [&] {
    checkEncodings(rq);
    if (kind != RequestKind::kPush && kind != RequestKind::kPushPull &&
        kind != RequestKind::kPull) {
      return;  // hello: ps_protocol; init, bye: no more than a size or nothing
    }
    const Target t = requestTarget(rq, m.partition, m.shards[server], server);
    checkTarget(m, server, t);
    const auto pieces = targetPieces(m.partition, server, t);
    if (kind != RequestKind::kPull) {
      if (mode & 4) rq.bytes = pushPayloadBytes(rq.encoding, rq.density, pieces, keys);
      checkPushBytes(rq, pieces, keys);
      SHOAL_FUZZ_CHECK(kTarget,
                       rq.bytes == pushPayloadBytes(rq.encoding, rq.density, pieces, keys));
      if (isCompressedPush(rq) && payloadSize >= rq.bytes) {
        // Exactly the checked size, so that ASan sees a read past it.
        const std::vector<uint8_t> exact(payload, payload + rq.bytes);
        std::vector<float> out(t.count);
        decodePush(static_cast<Encoding>(rq.encoding), rq.density, pieces, keys, exact.data(),
                   out.data());
        checkStatePieces(m, pieces, rq, exact.data(), out);
      }
    }
    if (kind != RequestKind::kPush) {
      if (mode & 8) rq.pullBytes = pullPayloadBytes(rq.pullEncoding, t.count);
      checkPullBytes(rq, t.count);
      std::vector<float> values(t.count, 1.5f);
      std::vector<uint16_t> half;
      size_t bytes = 0;
      encodePull(rq, values.data(), t.count, half, bytes);
      SHOAL_FUZZ_CHECK(kTarget, bytes == rq.pullBytes);
    }
  });
  return 0;
}
