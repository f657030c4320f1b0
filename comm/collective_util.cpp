#include "comm/collective_util.h"

#include <limits>

namespace shoal::comm::detail {

void checkBuffer(const Group& g, const void* p, size_t count, DataType type, const char* what) {
  if (!validDataType(static_cast<uint8_t>(type))) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: invalid data type {}", g.rank(), what,
                static_cast<int>(type));
  }
  // count x 16 x element size x group size must fit a size_t (a multiplication: three
  // divisions were a fifth of a small send's cost).
  size_t total = 0;
  if (__builtin_mul_overflow(count, 16 * elementSize(type) * static_cast<size_t>(g.size()),
                             &total)) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: count {} is too large", g.rank(), what, count);
  }
  if (count > 0 && p == nullptr) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: null buffer for {} elements", g.rank(), what, count);
  }
}

void checkRoot(const Group& g, int root, const char* what) {
  if (root < 0 || root >= g.size()) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: root {} outside 0..{}", g.rank(), what, root,
                g.size() - 1);
  }
}

void checkReduceOp(ReduceOp op) {
  if (!validReduceOp(static_cast<uint8_t>(op))) {
    SHOAL_THROW(InvalidArgument, "invalid reduce op {}", static_cast<int>(op));
  }
}

}  // namespace shoal::comm::detail
