// Framing shared by the TCP store's server and client (see tcp_store.h for the format).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shoal::store::wire {

enum Command : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kWait = 5,
  kDelete = 6,
  kCheck = 7,
};
enum Status : uint8_t { kOk = 0, kFailed = 1 };

// The most any frame may claim (a reply carries at most one value; servers set their own,
// smaller, request limit from TcpStoreServerOptions).
inline constexpr uint32_t kMaxFrame = 64u << 20;
// Fixed bytes of a frame before its fields: u8 code + u32 field count (after the u32 length).
inline constexpr uint32_t kFrameHeader = 5;

struct Message {
  uint8_t code = 0;
  std::vector<std::string> fields;
};

std::string encode(uint8_t code, const std::vector<std::string>& fields);

// Parses one frame from the front of `buf`. Returns nullopt if more bytes are needed; throws
// ProtocolError for a frame that is malformed or longer than `maxFrame` (checked before any
// allocation). On success removes it from buf.
std::optional<Message> tryDecode(std::string& buf, uint32_t maxFrame = kMaxFrame);

// The length word at the front of `buf` (the bytes after it), or nullopt if fewer than 4.
std::optional<uint32_t> peekLength(const std::string& buf);

}  // namespace shoal::store::wire
