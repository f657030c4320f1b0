// Which gradient compression a job uses, as a user writes it (`--compression`, and the
// parameter-server and DDP options that take a spec).
//
//   none | fp16 | bf16 | topk:DENSITY | powersgd:RANK | onebit
//        [,momentum=M] [,dense=ELEMENTS] [,warmup=STEPS]
//
// e.g. "topk:0.01" sends the 1% largest-magnitude elements of every bucket, "powersgd:4,warmup=50"
// sends rank-4 factors after 50 uncompressed synchronized steps. Every codec but the casts keeps
// an error-feedback residual (what was not sent is added to the next step's gradient), so no
// part of a gradient is lost, only delayed.
//
// momentum=M (topk and onebit only; M in [0, 1), 0 meaning none) moves SGD's momentum into the
// codec, before compression (comm/compress/momentum_correction.h): what arrives is an update to
// apply as plain SGD, so the optimizer must then run without momentum of its own (train::Trainer
// refuses otherwise; the parameter servers refuse the option). dense=N (topk and onebit; DDP and
// ZeRO-1 only) sends every parameter of at most N elements whole and encodes each larger one on
// its own (train/ddp/compression_hook.h).
//
// Pure data: parsing and printing, no state. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shoal::compress {

enum class Codec : uint8_t {
  kNone = 0,
  kFp16 = 1,      // cast to IEEE half; the reduction accumulates in float32
  kBf16 = 2,      // cast to bfloat16 (float32's range, 8 bits of mantissa)
  kTopK = 3,      // the `density` fraction of largest-magnitude elements, with error feedback
  kPowerSgd = 4,  // rank-`rank` factors P, Q of each matrix (Vogels et al. 2019), train/ddp only
  kOneBit = 5,    // the signs and one scale (mean magnitude) per bucket, with error feedback
};

struct CompressionSpec {
  Codec codec = Codec::kNone;
  double density = 0.01;      // top-k: fraction of elements sent, in (0, 1]
  int rank = 4;               // PowerSGD: rank of the approximation, 1..1024
  double momentum = 0;        // topk, onebit: the codec's momentum factor, in [0, 1); 0: none
  int64_t denseElements = 0;  // topk, onebit: parameters this small are sent whole; 0: none
  int64_t warmupSteps = 0;    // synchronized steps sent uncompressed before compression starts

  // Throws InvalidArgument with one line naming the bad part and what is accepted.
  static CompressionSpec parse(std::string_view text);
  // The canonical text ("topk:0.01,momentum=0.9,dense=65536,warmup=50"); parse(toString())
  // gives the same spec.
  std::string toString() const;
  bool enabled() const { return codec != Codec::kNone; }
};

std::string_view toString(Codec codec);

}  // namespace shoal::compress
