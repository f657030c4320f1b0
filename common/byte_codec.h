// The binary payloads Shoal writes itself (parameter-server shard snapshots, elastic training
// states): fixed-size values in the machine's byte order (little endian on every supported
// machine) and u64-length-prefixed byte strings, appended to a std::string; and a reader that
// checks every length against the bytes that remain before it sizes or copies anything, so a
// truncated or crafted payload is an InvalidArgument naming its source, never an allocation.
//
// Header-only; a reader is used by one thread at a time and must not outlive its bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/error.h"

namespace shoal {

template <typename T>
void putValue(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// u64 length, then the bytes.
inline void putBytes(std::string& out, const void* data, size_t n) {
  putValue<uint64_t>(out, n);
  out.append(static_cast<const char*>(data), n);
}

class ByteReader {
 public:
  // `source` names the payload in errors ("shard snapshot /x/y").
  ByteReader(std::string_view s, std::string source) : s_(s), source_(std::move(source)) {}

  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  // `n` raw bytes.
  std::string_view take(uint64_t n) {
    if (n > s_.size() - at_) {
      SHOAL_THROW(InvalidArgument, "{} is truncated: {} more bytes needed, {} left", source_, n,
                  s_.size() - at_);
    }
    std::string_view v(s_.data() + at_, n);
    at_ += n;
    return v;
  }
  // A string written by putBytes.
  std::string_view bytes() { return take(get<uint64_t>()); }
  // A count of `size`-byte items that must all still be in the payload.
  uint64_t count(size_t size, const char* what) {
    const auto n = get<uint64_t>();
    if (n > (s_.size() - at_) / size) {
      SHOAL_THROW(InvalidArgument,
                  "{} is corrupt: it claims {} {}, more than its remaining {} bytes can hold",
                  source_, n, what, s_.size() - at_);
    }
    return n;
  }
  bool atEnd() const { return at_ == s_.size(); }
  size_t remaining() const { return s_.size() - at_; }
  const std::string& source() const { return source_; }

 private:
  std::string_view s_;
  std::string source_;
  size_t at_ = 0;
};

}  // namespace shoal
