#include "common/reduce.h"

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "common/reduce_isa.h"

namespace shoal {

namespace reduce_isa {

namespace {

#if defined(__x86_64__)
// F16C is not asked separately: every CPU with AVX2 has it (Intel since Haswell, AMD since
// Piledriver), and clang's __builtin_cpu_supports does not know its name.
bool hasAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool hasAvx512() {
  return hasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#endif

Kernels choose() {
  const auto sets = available();
  const char* forced = std::getenv("SHOAL_REDUCE_ISA");
  if (!forced || !*forced) return sets.back();
  for (const Kernels& k : sets) {
    if (k.name == forced) return k;
  }
  std::string names;
  for (const Kernels& k : sets) names += (names.empty() ? "" : ", ") + std::string(k.name);
  SHOAL_THROW(InvalidArgument,
              "SHOAL_REDUCE_ISA={}: not an instruction set this CPU runs (choose from: {})", forced,
              names);
}

}  // namespace

std::vector<Kernels> available() {
  std::vector<Kernels> sets{
      {"generic", generic::reduceTo, generic::scaleAverage, generic::toHalf, generic::fromHalf}};
#if defined(__x86_64__)  // elsewhere only the generic kernels are built
  __builtin_cpu_init();
  if (hasAvx2()) {
    sets.push_back({"avx2", avx2::reduceTo, avx2::scaleAverage, avx2::toHalf, avx2::fromHalf});
  }
  if (hasAvx512()) {
    sets.push_back(
        {"avx512", avx512::reduceTo, avx512::scaleAverage, avx512::toHalf, avx512::fromHalf});
  }
#endif
  return sets;
}

const Kernels& selected() {
  // Chosen once: the CPU does not change under a running process.
  static const Kernels kernels = choose();
  return kernels;
}

}  // namespace reduce_isa

namespace {

void checkDivisor(ReduceOp op, int divisor) {
  if (divisor < 1 || (divisor > 1 && op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
    SHOAL_THROW(InvalidArgument, "reduce: divisor {} with op {} (only sum and avg divide)", divisor,
                static_cast<int>(op));
  }
}

}  // namespace

void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
              int divisor) {
  if (divisor != 1) checkDivisor(op, divisor);
  reduce_isa::selected().reduceTo(dst, a, b, count, type, op, divisor);
}

void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op, int divisor) {
  reduceTo(dst, dst, src, count, type, op, divisor);
}

void scaleAverage(void* data, size_t count, DataType type, int n) {
  if (n == 1) return;
  reduce_isa::selected().scaleAverage(data, count, type, n);
}

void convertToHalf(const float* in, uint16_t* out, size_t count) {
  reduce_isa::selected().toHalf(in, out, count);
}

void convertFromHalf(const uint16_t* in, float* out, size_t count) {
  reduce_isa::selected().fromHalf(in, out, count);
}

}  // namespace shoal
