#include "common/error.h"

#include <cstring>

namespace shoal {

void throwSystemError(const std::string& what, int err) {
  throw SystemError(fmt::format("{}: {} (errno {})", what, std::strerror(err), err));
}

}  // namespace shoal
