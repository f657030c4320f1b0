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

inline constexpr uint32_t kMaxFrame = 64u << 20;

struct Message {
  uint8_t code = 0;
  std::vector<std::string> fields;
};

std::string encode(uint8_t code, const std::vector<std::string>& fields);

// Parses one frame from the front of `buf`. Returns nullopt if more bytes are needed; throws
// ProtocolError for a frame that is malformed or oversized. On success removes it from buf.
std::optional<Message> tryDecode(std::string& buf);

}  // namespace shoal::store::wire
