// The reduction kernels for CPUs with AVX-512 (F, BW, VL) besides AVX2, FMA and F16C
// (common/reduce_isa.h).
#if defined(__x86_64__)
#define SHOAL_REDUCE_ISA avx512
#define SHOAL_REDUCE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#include "common/reduce_kernels.inc"
#endif
