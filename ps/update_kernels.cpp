#include "ps/update_kernels.h"

#include "common/error.h"
#include "common/reduce_isa.h"

namespace shoal::ps::update_isa {

std::vector<Kernels> available() {
  // The same sets as the reduction kernels', so one name (and SHOAL_REDUCE_ISA) covers both.
  std::vector<Kernels> sets;
  for (const reduce_isa::Kernels& r : reduce_isa::available()) {
    if (r.name == "generic") sets.push_back({r.name, generic::update});
#if defined(__x86_64__)
    if (r.name == "avx2") sets.push_back({r.name, avx2::update});
    // AVX2's loops on an AVX-512 CPU too: the gradient comes from a ring record, 8 bytes past
    // a cache line, and every 64-byte load of it splits two lines; AVX-512 loops were up to 14%
    // slower beyond the L2 (a 16 MiB SGD update 0.62 against 0.54 ms) and never faster.
    if (r.name == "avx512") sets.push_back({r.name, avx2::update});
#endif
  }
  return sets;
}

const Kernels& selected() {
  static const Kernels kernels = [] {
    for (const Kernels& k : available()) {
      if (k.name == reduce_isa::selected().name) return k;
    }
    SHOAL_THROW(InternalError, "no optimizer update kernels for instruction set {}",
                reduce_isa::selected().name);
  }();
  return kernels;
}

}  // namespace shoal::ps::update_isa
