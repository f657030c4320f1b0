// The reduction kernels of common/reduce.h, one copy per x86 instruction set, chosen at run
// time: the build is portable (no -march=native unless SHOAL_NATIVE asks), yet a CPU with AVX2
// or AVX-512 runs kernels vectorized for it.
//
// The choice is made once, on first use, from the CPU's features (cpuid), unless
// SHOAL_REDUCE_ISA names one (generic, avx2 or avx512: for tests and measurements; a set the CPU
// lacks, or an unknown name, is an InvalidArgument on first use). Thread-safe. Every copy
// computes the same results bit for bit (common/reduce_kernels.inc), except which NaN payload
// an operation on two NaNs keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace shoal::reduce_isa {

// How many of `count` elements of `esize` bytes at `p` come before the first 64-byte boundary
// (all of them when it lies beyond): the kernels run those apart, so that the vector loop's
// stores never split a cache line. Plain arithmetic, the same in every copy of the kernels.
inline size_t elementsBeforeLine(const void* p, size_t esize, size_t count) {
  constexpr uintptr_t kLine = 64;
  const size_t toLine = (kLine - reinterpret_cast<uintptr_t>(p) % kLine) % kLine / esize;
  return toLine < count ? toLine : count;
}

// One instruction set's kernels: the contracts of reduceTo and scaleAverage in
// common/reduce.h, without their argument checks (reduce.cpp makes them).
struct Kernels {
  std::string_view name;
  void (*reduceTo)(void* dst, const void* a, const void* b, size_t count, DataType type,
                   ReduceOp op, int divisor);
  void (*scaleAverage)(void* data, size_t count, DataType type, int n);
  // float32 <-> float16, element by element (common/reduce.h's convertToHalf / convertFromHalf).
  void (*toHalf)(const float* in, uint16_t* out, size_t count);
  void (*fromHalf)(const uint16_t* in, float* out, size_t count);
};

// The sets this CPU can run, widest last ("generic" always first).
std::vector<Kernels> available();

// The kernels common/reduce.h uses (see above).
const Kernels& selected();

#define SHOAL_REDUCE_ISA_DECLARE(isa)                                                              \
  namespace isa {                                                                                  \
  void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op, \
                int divisor);                                                                      \
  void scaleAverage(void* data, size_t count, DataType type, int n);                               \
  void toHalf(const float* in, uint16_t* out, size_t count);                                       \
  void fromHalf(const uint16_t* in, float* out, size_t count);                                     \
  }
SHOAL_REDUCE_ISA_DECLARE(generic)
SHOAL_REDUCE_ISA_DECLARE(avx2)
SHOAL_REDUCE_ISA_DECLARE(avx512)
#undef SHOAL_REDUCE_ISA_DECLARE

}  // namespace shoal::reduce_isa
