#include "ps/payload_codec.h"

#include <algorithm>
#include <cstring>

#include "comm/compress/half_cast.h"
#include "comm/compress/sign.h"
#include "comm/compress/topk.h"
#include "common/error.h"

namespace shoal::ps {

namespace {

constexpr auto kLastEncoding = Encoding::kOneBit;

DataType halfType(Encoding e) {
  return e == Encoding::kFp16 ? DataType::kFloat16 : DataType::kBFloat16;
}

Encoding checkedEncoding(uint8_t id) {
  if (id > static_cast<uint8_t>(kLastEncoding)) {
    SHOAL_THROW(InvalidArgument,
                "unknown payload encoding {} (this server knows raw, fp16, bf16, topk, onebit)",
                id);
  }
  return static_cast<Encoding>(id);
}

// Bytes of one piece of n elements (Note [Payload layout]); `density` checked by the caller.
uint64_t pieceBytes(Encoding e, double density, size_t n, bool parameter) {
  if (!parameter) return n * sizeof(float);
  switch (e) {
    case Encoding::kRaw:
      return n * sizeof(float);
    case Encoding::kFp16:
    case Encoding::kBf16:
      return n * sizeof(uint16_t);
    case Encoding::kTopK:
      return compress::topkMessageBytes(compress::topkCount(n, density));
    case Encoding::kOneBit:
      return compress::signMessageBytes(n);
  }
  SHOAL_THROW(InternalError, "encoding {}", static_cast<int>(e));
}

bool isParameter(const std::vector<KeySpec>& keys, const Piece& p) {
  return keys.at(static_cast<size_t>(p.key)).kind == KeyKind::kParameter;
}

}  // namespace

Encoding pushEncoding(const compress::CompressionSpec& spec) {
  // The servers' optimizer holds the momentum; a worker-side one (compress/spec.h) would apply
  // it twice. Pushes encode pieces of a flat partition, not parameters (Note [Payload layout]).
  if (spec.momentum != 0 || spec.denseElements != 0) {
    SHOAL_THROW(InvalidArgument,
                "parameter servers do not support compression {}: momentum= and dense= are DDP's "
                "and ZeRO-1's (the servers' optimizer applies the momentum)",
                spec.toString());
  }
  switch (spec.codec) {
    case compress::Codec::kNone:
      return Encoding::kRaw;
    case compress::Codec::kFp16:
      return Encoding::kFp16;
    case compress::Codec::kBf16:
      return Encoding::kBf16;
    case compress::Codec::kTopK:
      return Encoding::kTopK;
    case compress::Codec::kOneBit:
      return Encoding::kOneBit;
    case compress::Codec::kPowerSgd:
      break;
  }
  SHOAL_THROW(InvalidArgument,
              "parameter servers do not support {} compression (DDP only); use none, fp16, bf16, "
              "topk:DENSITY or onebit",
              compress::toString(spec.codec));
}

uint64_t pushPayloadBytes(uint8_t encoding, double density, std::span<const Piece> pieces,
                          const std::vector<KeySpec>& keys) {
  const Encoding e = checkedEncoding(encoding);
  if (e == Encoding::kTopK && !(density > 0 && density <= 1)) {
    SHOAL_THROW(InvalidArgument, "a top-k density of {} (expected one in (0, 1])", density);
  }
  uint64_t bytes = 0;
  for (const Piece& p : pieces) bytes += pieceBytes(e, density, p.count, isParameter(keys, p));
  return bytes;
}

uint64_t pullPayloadBytes(uint8_t encoding, size_t n) {
  const Encoding e = checkedEncoding(encoding);
  if (e == Encoding::kRaw) return n * sizeof(float);
  if (e == Encoding::kFp16) return n * sizeof(uint16_t);
  SHOAL_THROW(InvalidArgument, "a pull in {} (values are sent as raw float32 or fp16)",
              toString(e));
}

void checkEncodings(const Request& rq) {
  if (rq.version != kProtocolVersion) {
    SHOAL_THROW(InvalidArgument, "parameter-server protocol version {} (this server speaks {})",
                rq.version, kProtocolVersion);
  }
  const auto kind = static_cast<RequestKind>(rq.kind);
  if (rq.encoding != 0 && kind != RequestKind::kPush && kind != RequestKind::kPushPull) {
    SHOAL_THROW(InvalidArgument, "payload encoding {} on a {} (only pushes are encoded)",
                rq.encoding, toString(kind));
  }
  if (rq.pullEncoding != 0 && kind != RequestKind::kPull && kind != RequestKind::kPushPull) {
    SHOAL_THROW(InvalidArgument, "pull encoding {} on a {}", rq.pullEncoding, toString(kind));
  }
}

void checkPushBytes(const Request& rq, std::span<const Piece> pieces,
                    const std::vector<KeySpec>& keys) {
  const uint64_t expected = pushPayloadBytes(rq.encoding, rq.density, pieces, keys);
  if (rq.bytes != expected) {
    SHOAL_THROW(InvalidArgument, "the {} push carries {} bytes, expected {}",
                toString(static_cast<Encoding>(rq.encoding)), rq.bytes, expected);
  }
}

void checkPullBytes(const Request& rq, size_t n) {
  const uint64_t expected = pullPayloadBytes(rq.pullEncoding, n);
  if (rq.pullBytes != expected) {
    SHOAL_THROW(InvalidArgument, "the pull's {} buffer carries {} bytes, expected {}",
                toString(static_cast<Encoding>(rq.pullEncoding)), rq.pullBytes, expected);
  }
}

bool isCompressedPush(const Request& rq) {
  const auto kind = static_cast<RequestKind>(rq.kind);
  return rq.encoding != 0 && (kind == RequestKind::kPush || kind == RequestKind::kPushPull);
}

const void* encodePull(const Request& rq, const float* values, size_t n,
                       std::vector<uint16_t>& half, size_t& bytes) {
  if (rq.pullEncoding != static_cast<uint8_t>(Encoding::kFp16)) {
    bytes = n * sizeof(float);
    return values;
  }
  half.resize(n);
  compress::encodeHalf(DataType::kFloat16, values, half.data(), n);
  bytes = n * sizeof(uint16_t);
  return half.data();
}

PushEncoder::PushEncoder(const compress::CompressionSpec& spec, const Partition& partition)
    : spec_(spec), encoding_(pushEncoding(spec)) {
  SHOAL_ASSERT(encoding_ != Encoding::kRaw, "a push encoder without compression");
  for (const KeySpec& k : partition.keys()) parameter_.push_back(k.kind == KeyKind::kParameter);
  if (encoding_ == Encoding::kTopK) compress::topkCount(1, spec.density);  // checks the density
  if (encoding_ == Encoding::kTopK || encoding_ == Encoding::kOneBit) {
    residual_.assign(partition.totalElements(), 0.0f);
  }
}

void PushEncoder::restoreResidual(std::span<const float> saved) {
  if (residual_.empty() || saved.size() != residual_.size()) {
    SHOAL_THROW(InvalidArgument,
                "{} error-feedback residuals for a {} encoder of a model of {} elements",
                saved.size(), toString(encoding_), residual_.empty() ? 0 : residual_.size());
  }
  std::copy(saved.begin(), saved.end(), residual_.begin());
}

Encoding PushEncoder::encodingAt(int64_t step) const {
  return step < spec_.warmupSteps ? Encoding::kRaw : encoding_;
}

void PushEncoder::encode(Encoding encoding, std::span<const Piece> pieces, const float* grad,
                         std::vector<uint8_t>& out) {
  SHOAL_ASSERT(encoding == encoding_, "a {} push from a {} encoder", toString(encoding),
               toString(encoding_));
  uint64_t bytes = 0;
  for (const Piece& p : pieces) {
    bytes += pieceBytes(encoding, spec_.density, p.count, parameter_.at(p.key));
  }
  out.resize(bytes);
  uint8_t* at = out.data();
  for (const Piece& p : pieces) {
    const size_t n = p.count;
    const bool parameter = parameter_[p.key];
    if (!parameter) {
      std::memcpy(at, grad, n * sizeof(float));
    } else if (encoding == Encoding::kFp16 || encoding == Encoding::kBf16) {
      // Even offsets only: every piece of a cast message is 2 or 4 bytes per element.
      compress::encodeHalf(halfType(encoding), grad, reinterpret_cast<uint16_t*>(at), n);
    } else if (encoding == Encoding::kTopK) {
      compress::topkEncode(grad, residual_.data() + p.flat, n,
                           compress::topkCount(n, spec_.density), at);
    } else {
      compress::signEncode(grad, residual_.data() + p.flat, n, at);
    }
    at += pieceBytes(encoding, spec_.density, n, parameter);
    grad += n;
  }
}

void decodePush(Encoding encoding, double density, std::span<const Piece> pieces,
                const std::vector<KeySpec>& keys, const uint8_t* payload, float* out) {
  for (const Piece& p : pieces) {
    const size_t n = p.count;
    const bool parameter = isParameter(keys, p);
    if (!parameter || encoding == Encoding::kRaw) {
      std::memcpy(out, payload, n * sizeof(float));
    } else if (encoding == Encoding::kFp16 || encoding == Encoding::kBf16) {
      compress::decodeHalf(halfType(encoding), reinterpret_cast<const uint16_t*>(payload), out, n);
    } else {
      std::fill(out, out + n, 0.0f);
      try {
        if (encoding == Encoding::kTopK) {
          compress::topkAccumulate(payload, compress::topkCount(n, density), 1.0f, out, n);
        } else {
          compress::signAccumulate(payload, n, 1.0f, out);
        }
      } catch (const ProtocolError& e) {
        SHOAL_THROW(InvalidArgument, "the {} message of key '{}' [{}:{}]: {}", toString(encoding),
                    keys[p.key].name, p.offset, p.offset + n, e.what());
      }
    }
    payload += pieceBytes(encoding, density, n, parameter);
    out += n;
  }
}

}  // namespace shoal::ps
