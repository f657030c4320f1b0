// The reduction kernels for any x86-64 CPU (common/reduce_isa.h).
#define SHOAL_REDUCE_ISA generic
#define SHOAL_REDUCE_TARGET
#include "common/reduce_kernels.inc"
