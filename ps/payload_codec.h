// The payload encodings of parameter-server pushes and pulls (Request::encoding and
// Request::pullEncoding in ps/protocol.h): how a worker compresses one push to one server, with
// its error-feedback residuals, and how the server checks and decodes it into float32 before the
// shard sees it.
//
// Note [Payload layout]: a push covers a run of one server's pieces (ps/partition.h: all of
// them, or one key's). Each piece is encoded on its own and the messages lie end to end in piece
// order. A parameter piece of n elements (gradients):
//   raw     n float32
//   fp16    n IEEE half (comm/compress/half_cast.h); no residual: a cast keeps nothing back
//   bf16    n bfloat16, likewise
//   topk    topkMessageBytes(topkCount(n, density)) (comm/compress/topk.h): k ascending uint32
//           indices into the piece, then k float32 values
//   onebit  signMessageBytes(n) (comm/compress/sign.h): a float32 scale (the mean magnitude),
//           then ceil(n / 8) bytes of signs
// A state piece (values such as BatchNorm statistics, which replace the server's) is n float32
// whatever the encoding: holding part of a value back would make no sense.
// So a payload's size follows from the encoding, the density and the pieces alone, and the
// server checks it exactly before it receives anything. A pull's values are n float32 (raw) or
// n fp16 (kFp16).
//
// Error feedback (topk, onebit): the worker keeps one float32 residual per element of the model
// (flat, so per key): what it has not sent yet. A push encodes gradient + residual and keeps what
// it left out, so what the servers applied plus the residual is the sum of the gradients.
//
// Thread-safety: the free functions are pure; a PushEncoder is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/compress/spec.h"
#include "ps/partition.h"
#include "ps/protocol.h"

namespace shoal::ps {

// The encoding pushes use under `spec` once its warm-up is over. InvalidArgument (one line) for
// powersgd: it factors whole matrices across ranks, which only DDP has (train/ddp/); and for a
// spec with momentum= or dense= (the servers' optimizer applies the momentum; pushes are cut
// by pieces, not parameters).
Encoding pushEncoding(const compress::CompressionSpec& spec);

// Bytes of a push payload of `pieces` (contiguous, one server's) in `encoding`, raw included.
// InvalidArgument for an unknown encoding id or, for top-k, a density outside (0, 1].
uint64_t pushPayloadBytes(uint8_t encoding, double density, std::span<const Piece> pieces,
                          const std::vector<KeySpec>& keys);
// Bytes of the values of n elements a pull asks for in `encoding`: raw or fp16 (InvalidArgument
// for any other).
uint64_t pullPayloadBytes(uint8_t encoding, size_t n);

// The server's checks of a request, each refusing with InvalidArgument (one line).
// checkEncodings: the version, and encodings only where a payload or values can be encoded.
// checkPushBytes / checkPullBytes: a push's size (`pieces`: what it covers) or a pull's for n
// elements, against its encoding.
void checkEncodings(const Request& rq);
void checkPushBytes(const Request& rq, std::span<const Piece> pieces,
                    const std::vector<KeySpec>& keys);
void checkPullBytes(const Request& rq, size_t n);
bool isCompressedPush(const Request& rq);

// The values of a pull's reply in its encoding: `values` themselves (raw) or their fp16
// rounding in `half`. Sets `bytes` to what is sent from the pointer returned.
const void* encodePull(const Request& rq, const float* values, size_t n,
                       std::vector<uint16_t>& half, size_t& bytes);

// The worker's side: encodes pushes and keeps the residuals.
class PushEncoder {
 public:
  // `spec` must be enabled and not powersgd (pushEncoding()).
  PushEncoder(const compress::CompressionSpec& spec, const Partition& partition);

  // The encoding of a push of `step`: raw during the spec's warm-up (steps < warmupSteps).
  Encoding encodingAt(int64_t step) const;
  double density() const { return spec_.density; }
  // Encodes `grad` (the elements of `pieces` end to end) in `encoding` (not raw) into `out`,
  // resized to pushPayloadBytes(); the residuals of those elements move on.
  void encode(Encoding encoding, std::span<const Piece> pieces, const float* grad,
              std::vector<uint8_t>& out);
  // What error feedback holds back, per element of the model (flat order); empty for the casts.
  const std::vector<float>& residual() const { return residual_; }
  // Replaces the residuals with saved ones (ps/residual_checkpoint.h). InvalidArgument unless
  // `saved` has one per element of the model and this encoder keeps residuals.
  void restoreResidual(std::span<const float> saved);

 private:
  compress::CompressionSpec spec_;
  Encoding encoding_;
  std::vector<char> parameter_;  // per key: gradients (encoded) or state values (raw)
  std::vector<float> residual_;
};

// The server's side: decodes a payload whose size was checked (pushPayloadBytes()) into `out`,
// the pieces' elements end to end in float32. A message the codec refuses (a top-k index out of
// range or not ascending, a 1-bit scale that is not finite) throws InvalidArgument naming the
// piece; `out` may then be partly written, nothing else is.
void decodePush(Encoding encoding, double density, std::span<const Piece> pieces,
                const std::vector<KeySpec>& keys, const uint8_t* payload, float* out);

}  // namespace shoal::ps
