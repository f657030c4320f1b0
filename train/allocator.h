// glibc's malloc hands blocks above 128 KiB (its default mmap threshold, which then adapts)
// straight to mmap and returns them to the kernel on free, so every training step pays page
// faults on fresh memory for its activations: on this 2-core machine that was 3x the run time
// of a short job. Keeping freed memory in the heap (a high mmap threshold and no trimming) lets
// steps reuse it, as PyTorch users get from jemalloc or tcmalloc.
#pragma once

namespace shoal::train {

// Call once at start-up, before the first large allocation.
void keepFreedMemoryForReuse();

}  // namespace shoal::train
