#include "store/tcp_store_protocol.h"

#include <cstring>

#include "common/error.h"

namespace shoal::store::wire {

namespace {
void putU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}
uint32_t getU32(const std::string& buf, size_t at) {
  uint32_t v;
  std::memcpy(&v, buf.data() + at, 4);
  return v;
}
}  // namespace

std::string encode(uint8_t code, const std::vector<std::string>& fields) {
  std::string body;
  body.push_back(static_cast<char>(code));
  putU32(body, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    putU32(body, static_cast<uint32_t>(f.size()));
    body += f;
  }
  if (body.size() > kMaxFrame) {
    SHOAL_THROW(InvalidArgument, "store message of {} bytes exceeds the {} byte limit", body.size(),
                kMaxFrame);
  }
  std::string out;
  putU32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

std::optional<uint32_t> peekLength(const std::string& buf) {
  if (buf.size() < 4) return std::nullopt;
  return getU32(buf, 0);
}

std::optional<Message> tryDecode(std::string& buf, uint32_t maxFrame) {
  if (buf.size() < 4) return std::nullopt;
  uint32_t len = getU32(buf, 0);
  if (len < kFrameHeader || len > maxFrame) {
    SHOAL_THROW(ProtocolError, "store frame length {} outside {}..{}", len, kFrameHeader, maxFrame);
  }
  if (buf.size() < 4 + static_cast<size_t>(len)) return std::nullopt;
  Message m;
  m.code = static_cast<uint8_t>(buf[4]);
  uint32_t n = getU32(buf, 5);
  size_t at = 9;
  const size_t end = 4 + static_cast<size_t>(len);
  if (n > len / 4) SHOAL_THROW(ProtocolError, "store frame claims {} fields in {} bytes", n, len);
  for (uint32_t i = 0; i < n; ++i) {
    if (at + 4 > end) SHOAL_THROW(ProtocolError, "store frame truncated in field {}", i);
    uint32_t fl = getU32(buf, at);
    at += 4;
    if (fl > end - at) SHOAL_THROW(ProtocolError, "store field {} overruns its frame", i);
    m.fields.emplace_back(buf.data() + at, fl);
    at += fl;
  }
  if (at != end) SHOAL_THROW(ProtocolError, "store frame has {} trailing bytes", end - at);
  buf.erase(0, end);
  return m;
}

}  // namespace shoal::store::wire
