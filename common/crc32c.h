// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF),
// the checksum of TFRecord files (tools/tensorboard_writer.h), iSCSI and ext4. Table-driven, a
// byte at a time: the event files it checks are small next to what a training step costs, so
// no SSE4.2 path.
//
// Pure functions; thread-safe (the table is a constant built at compile time). Never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shoal {

// The CRC-32C of `n` bytes at `data`. crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);

inline uint32_t crc32c(std::string_view bytes) {
  return crc32c(bytes.data(), bytes.size());
}

// Extends `crc` (a finished crc32c of earlier bytes, or 0 for none) over `n` more bytes:
// crc32cExtend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32cExtend(uint32_t crc, const void* data, size_t n);

}  // namespace shoal
