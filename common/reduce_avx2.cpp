// The reduction kernels for CPUs with AVX2, FMA and F16C (common/reduce_isa.h).
#if defined(__x86_64__)
#define SHOAL_REDUCE_ISA avx2
#define SHOAL_REDUCE_TARGET __attribute__((target("avx2,fma,f16c")))
#include "common/reduce_kernels.inc"
#endif
