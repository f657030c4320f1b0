#include "train/allocator.h"

#include <malloc.h>

namespace shoal::train {

void keepFreedMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace shoal::train
