// The optimizer updates for CPUs with AVX2, and those with AVX-512 (ps/update_kernels.h).
#if defined(__x86_64__)
#define SHOAL_UPDATE_ISA avx2
#define SHOAL_UPDATE_TARGET __attribute__((target("avx2")))
#include "ps/update_kernels.inc"
#endif
