#include "comm/native/abort_record.h"

#include <fmt/format.h>

#include <cstdio>

namespace shoal::comm {

std::string worldPrefix(uint64_t generation) {
  return fmt::format("shoal/g{}", generation);
}

std::string abortRecordKey(int rank) {
  return fmt::format("abort/{}", rank);
}

std::string encodeAbortRecord(const transport::Failure& f) {
  return fmt::format("{} {}\n{}", static_cast<int>(f.kind), f.origin, f.text);
}

std::optional<transport::Failure> decodeAbortRecord(const std::string& v, int size) {
  transport::Failure f;
  int kind = 0;
  const size_t nl = v.find('\n');
  if (nl == std::string::npos || std::sscanf(v.c_str(), "%d %d", &kind, &f.origin) != 2 ||
      kind < 0 || kind > static_cast<int>(transport::AbortKind::kProtocol) || f.origin < -1 ||
      f.origin >= size) {
    return std::nullopt;
  }
  f.kind = static_cast<transport::AbortKind>(kind);
  f.text = v.substr(nl + 1, transport::kMaxAbortText);
  return f;
}

}  // namespace shoal::comm
