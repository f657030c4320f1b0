// The optimizer updates for CPUs with AVX-512 (F, VL) besides AVX2 (ps/update_kernels.h).
#if defined(__x86_64__)
#define SHOAL_UPDATE_ISA avx512
#define SHOAL_UPDATE_TARGET __attribute__((target("avx512f,avx512vl,avx2")))
#include "ps/update_kernels.inc"
#endif
