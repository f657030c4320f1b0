#include "store/store.h"

namespace shoal::store {

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += keys[i];
    if (i == 7 && keys.size() > 8) {
      out += ", ... (" + std::to_string(keys.size()) + " keys)";
      break;
    }
  }
  return out;
}

}  // namespace shoal::store
