// The frame the frame target's receiver expects next: the target compares every input with it,
// and the seed corpus (fuzz/train/make_corpus.cpp) holds exactly it and variations of it, so
// the two must not drift apart.
#pragma once

#include "common/types.h"
#include "transport/frame.h"

namespace shoal::fuzz {

inline transport::FrameHeader expectedFrame() {
  transport::FrameHeader e;
  e.op = static_cast<uint8_t>(transport::OpCode{1});
  e.dtype = static_cast<uint8_t>(DataType::kFloat32);
  e.redop = static_cast<uint8_t>(ReduceOp::kSum);
  e.algo = 1;
  e.group = 0x5eed0001;
  e.step = 3;
  e.seq = 5;
  e.count = 77;
  e.bytes = 77 * 4;
  return e;
}

}  // namespace shoal::fuzz
