#include "tools/tensorboard_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/crc32c.h"
#include "common/error.h"

namespace shoal::tools {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8;

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// Little endian whatever the machine: the formats say so.
void putLittle(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void putKey(std::string& out, uint32_t field, uint32_t wireType) {
  putVarint(out, (uint64_t{field} << 3) | wireType);
}

void putBytesField(std::string& out, uint32_t field, std::string_view bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 and 2. The step is written even when 0 (proto3 would omit it; both read the
// same) so every event has the same shape.
std::string eventHeader(double wallTime, int64_t step) {
  std::string out;
  uint64_t bits = 0;
  std::memcpy(&bits, &wallTime, sizeof(bits));
  putKey(out, 1, kFixed64);
  putLittle(out, bits, 8);
  putKey(out, 2, kVarint);
  putVarint(out, static_cast<uint64_t>(step));  // int64: negatives as 10-byte two's complement
  return out;
}

// The length of the well-formed UTF-8 sequence at s[i], or 0 (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF).
size_t utf8SequenceAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = b(i);
  if (lead < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

uint32_t maskedCrc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string tfRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  putLittle(out, data.size(), 8);
  putLittle(out, maskedCrc32c(out), 4);
  out.append(data);
  putLittle(out, maskedCrc32c(data), 4);
  return out;
}

std::string fileVersionEvent(double wallTime) {
  std::string out = eventHeader(wallTime, 0);
  putBytesField(out, 3, kEventFileVersion);
  return out;
}

std::string scalarEvent(double wallTime, int64_t step, std::string_view tag, float value) {
  std::string v;
  putBytesField(v, 1, tag);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  putKey(v, 2, kFixed32);
  putLittle(v, bits, 4);
  std::string summary;
  putBytesField(summary, 1, v);
  std::string out = eventHeader(wallTime, step);
  putBytesField(out, 5, summary);
  return out;
}

std::string utf8Tag(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (size_t i = 0; i < name.size();) {
    const size_t n = utf8SequenceAt(name, i);
    if (n == 0) {
      out.push_back('?');
      ++i;
    } else {
      out.append(name.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string eventFileName(int64_t seconds, std::string_view host) {
  std::string h(host.empty() ? "localhost" : host);
  for (char& c : h) {
    if (c == '/') c = '_';
  }
  return fmt::format("events.out.tfevents.{:010d}.{}", seconds, h);
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t fileSeconds, std::string_view host,
                                 double wallTime)
    : path_(dir + "/" + eventFileName(fileSeconds, host)),
      temporary_(fmt::format("{}/.shoal-tensorboard.{}.tmp", dir, ::getpid())) {
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) throwSystemError("event file " + temporary_ + ": cannot create it", errno);
  write(tfRecord(fileVersionEvent(wallTime)));
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temporary_.c_str());
  }
}

void EventFileWriter::write(std::string_view data) {
  SHOAL_CHECK(file_ != nullptr, "event file {}: written after finish()", path_);
  if (std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
    throwSystemError("event file " + temporary_ + ": write", errno);
  }
  ++records_;
}

void EventFileWriter::addScalar(std::string_view tag, int64_t step, float value, double wallTime) {
  write(tfRecord(scalarEvent(wallTime, step, utf8Tag(tag), value)));
}

std::string EventFileWriter::finish() {
  SHOAL_CHECK(file_ != nullptr, "event file {}: finish() called twice", path_);
  std::FILE* f = file_;
  file_ = nullptr;
  // fclose reports a failed final flush (a full disk) that fwrite did not.
  const bool flushed = std::fflush(f) == 0;
  const int flushErrno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!flushed || !closed) {
    const int err = flushed ? errno : flushErrno;
    std::remove(temporary_.c_str());
    throwSystemError("event file " + temporary_ + ": write", err);
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(temporary_.c_str());
    throwSystemError("event file " + path_ + ": rename into place", err);
  }
  return path_;
}

}  // namespace shoal::tools
