// The optimizer updates for any CPU (ps/update_kernels.h).
#define SHOAL_UPDATE_ISA generic
#define SHOAL_UPDATE_TARGET
#include "ps/update_kernels.inc"
