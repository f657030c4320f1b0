// Whole-file reads and atomic whole-file writes for model files (export and serving).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shoal::train {

// The largest model file read into memory (16 GiB): a bound on what an untrusted size may make
// the reader allocate, well above any model this layer trains.
inline constexpr uint64_t kMaxModelFileBytes = 16ull << 30;

// The bytes of `path`. InvalidArgument if it is missing, not a regular file or larger than
// `maxBytes`; SystemError if reading fails.
std::string readFileBytes(const std::string& path, uint64_t maxBytes = kMaxModelFileBytes);

// Writes `bytes` to path + ".tmp", flushes it to disk and renames it onto `path`: readers see
// the old file or the whole new one, never a part. SystemError naming the file if any step
// fails (the temporary file is then removed).
void writeFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace shoal::train
