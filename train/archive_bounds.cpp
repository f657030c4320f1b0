#include "train/archive_bounds.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.h"

namespace shoal::train {

namespace {

// Zip record signatures and fixed sizes (PKWARE APPNOTE 4.3).
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr size_t kLocalHeaderBytes = 30;
constexpr size_t kCentralHeaderBytes = 46;
constexpr size_t kEndBytes = 22;
constexpr size_t kEnd64LocatorBytes = 20;
constexpr size_t kEnd64Bytes = 56;
constexpr size_t kMaxComment = 0xffff;
// Deflate cannot expand data more than about 1032:1.
constexpr uint64_t kMaxDeflateRatio = 1032;

// Reads little-endian fields at checked offsets.
class Bytes {
 public:
  explicit Bytes(std::string_view s) : s_(s) {}
  size_t size() const { return s_.size(); }
  bool fits(uint64_t at, uint64_t n) const { return at <= s_.size() && n <= s_.size() - at; }
  uint64_t get(uint64_t at, int width, const char* what) const {
    if (!fits(at, static_cast<uint64_t>(width))) refuse(what, at);
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) {
      v = (v << 8) | static_cast<uint8_t>(s_[static_cast<size_t>(at) + static_cast<size_t>(i)]);
    }
    return v;
  }
  [[noreturn]] static void refuse(const char* what, uint64_t at) {
    SHOAL_THROW(InvalidArgument, "not a readable archive: {} at byte {} lies outside the file", what,
                at);
  }

 private:
  std::string_view s_;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t end = 0;  // where the directory's end records start (entries' data lies before)
};

Directory findDirectory(const Bytes& b) {
  if (b.size() < kEndBytes) {
    SHOAL_THROW(InvalidArgument, "not a readable archive: {} bytes is too short for a zip file",
                b.size());
  }
  // The end record is the last one; only a comment (at most 64 KiB) may follow it.
  const uint64_t lowest =
      b.size() > kEndBytes + kMaxComment ? b.size() - kEndBytes - kMaxComment : 0;
  uint64_t at = b.size() - kEndBytes;
  for (;; --at) {
    if (b.get(at, 4, "end record") == kEnd &&
        at + kEndBytes + b.get(at + 20, 2, "comment length") == b.size()) {
      break;
    }
    if (at == lowest) SHOAL_THROW(InvalidArgument, "not a readable archive: no zip end record");
  }
  Directory d;
  d.end = at;
  d.entries = b.get(at + 10, 2, "entry count");
  d.bytes = b.get(at + 12, 4, "directory size");
  d.offset = b.get(at + 16, 4, "directory offset");
  if (b.get(at + 4, 2, "disk number") != 0 || b.get(at + 6, 2, "directory disk") != 0) {
    SHOAL_THROW(InvalidArgument, "not a readable archive: multi-disk zip");
  }
  const bool zip64 = d.entries == 0xffff || d.bytes == 0xffffffff || d.offset == 0xffffffff;
  if (zip64 || (at >= kEnd64LocatorBytes &&
                b.get(at - kEnd64LocatorBytes, 4, "zip64 locator") == kEnd64Locator)) {
    if (at < kEnd64LocatorBytes ||
        b.get(at - kEnd64LocatorBytes, 4, "zip64 locator") != kEnd64Locator) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: zip64 sizes without a zip64 locator");
    }
    const uint64_t end64 = b.get(at - kEnd64LocatorBytes + 8, 8, "zip64 end offset");
    if (end64 > at - kEnd64LocatorBytes || !b.fits(end64, kEnd64Bytes) ||
        end64 + kEnd64Bytes > at - kEnd64LocatorBytes || b.get(end64, 4, "zip64 end") != kEnd64) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: bad zip64 end record");
    }
    d.end = end64;
    d.entries = b.get(end64 + 32, 8, "zip64 entry count");
    d.bytes = b.get(end64 + 40, 8, "zip64 directory size");
    d.offset = b.get(end64 + 48, 8, "zip64 directory offset");
  }
  if (d.offset > d.end || d.bytes > d.end - d.offset) {
    SHOAL_THROW(InvalidArgument,
                "not a readable archive: directory of {} bytes at {} overlaps its end record at {}",
                d.bytes, d.offset, d.end);
  }
  if (d.entries > d.bytes / kCentralHeaderBytes) {
    SHOAL_THROW(InvalidArgument, "not a readable archive: {} entries cannot fit a {}-byte directory",
                d.entries, d.bytes);
  }
  return d;
}

// The zip64 extended-information field replaces, in order, whichever of the three 32-bit fields
// are saturated.
void readZip64Extra(const Bytes& b, uint64_t extra, uint64_t extraLen, uint64_t& uncompressed,
                    uint64_t& compressed, uint64_t& local) {
  uint64_t at = extra;
  while (at + 4 <= extra + extraLen) {
    const uint64_t id = b.get(at, 2, "extra field id"), len = b.get(at + 2, 2, "extra field size");
    if (at + 4 + len > extra + extraLen) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: extra field overruns its entry");
    }
    if (id == 0x0001) {
      uint64_t p = at + 4, left = len;
      for (uint64_t* field : {&uncompressed, &compressed, &local}) {
        if (*field != 0xffffffff) continue;
        if (left < 8) SHOAL_THROW(InvalidArgument, "not a readable archive: short zip64 field");
        *field = b.get(p, 8, "zip64 size");
        p += 8;
        left -= 8;
      }
    }
    at += 4 + len;
  }
}

// Note [Pickle lengths]: libtorch's unpickler reserves whatever a string or bytes opcode claims
// before reading it (2.8 GB for a fuzzed 2 KiB checkpoint), so every length in a pickle record
// is checked against the bytes the record has left. The walk knows the argument layout of every
// opcode of protocols 0-5; an opcode it does not know ends the check with a refusal, as
// libtorch's unpickler would refuse it too.
void checkPickleLengths(std::string_view name, const Bytes& b, uint64_t begin, uint64_t size) {
  const uint64_t end = begin + size;
  uint64_t at = begin;
  auto need = [&](uint64_t n, const char* what) {
    if (n > end - at) {
      SHOAL_THROW(InvalidArgument,
                  "not a readable archive: {} claims {} bytes of {} with {} left in the record", name,
                  n, what, end - at);
    }
  };
  auto line = [&] {  // protocol 0 arguments end at a newline
    while (at < end && b.get(at, 1, "pickle") != '\n') ++at;
    need(1, "a text argument");
    ++at;
  };
  while (at < end) {
    const auto op = static_cast<uint8_t>(b.get(at++, 1, "pickle opcode"));
    uint64_t n = 0;
    switch (op) {
      // No argument.
      case '(':
      case '.':
      case '0':
      case '1':
      case '2':
      case 'N':
      case 'R':
      case 'Q':
      case 'a':
      case 'b':
      case 'd':
      case '}':
      case 'e':
      case 'l':
      case ']':
      case 'o':
      case 's':
      case 't':
      case ')':
      case 'u':
      case 0x81:
      case 0x85:
      case 0x86:
      case 0x87:
      case 0x88:
      case 0x89:
      case 0x8f:
      case 0x90:
      case 0x91:
      case 0x92:
      case 0x93:
      case 0x94:
      case 0x97:
      case 0x98:
        break;
      // Fixed-size arguments.
      case 0x80:
      case 'K':
      case 'h':
      case 'q':
        n = 1;
        break;
      case 0x82:
        n = 1;
        break;
      case 0x83:
        n = 2;
        break;
      case 0x84:
        n = 4;
        break;
      case 'M':
        n = 2;
        break;
      case 'J':
      case 'j':
      case 'r':
        n = 4;
        break;
      case 'G':
        n = 8;
        break;
      // Newline-terminated text (two lines for a global and an instance).
      case 'c':
      case 'i':
        line();
        line();
        break;
      case 'F':
      case 'I':
      case 'L':
      case 'P':
      case 'S':
      case 'V':
      case 'g':
      case 'p':
        line();
        break;
      // Lengths to check: 1, 4 or 8 bytes, then that many bytes.
      case 'C':
      case 'U':
      case 0x8a:
      case 0x8c:
        need(1, "a length");
        n = b.get(at, 1, "pickle length");
        at += 1;
        break;
      case 'B':
      case 'T':
      case 'X':
      case 0x8b:
        need(4, "a length");
        n = b.get(at, 4, "pickle length");
        at += 4;
        break;
      case 0x8d:
      case 0x8e:
      case 0x96:
        need(8, "a length");
        n = b.get(at, 8, "pickle length");
        at += 8;
        break;
      case 0x95:  // FRAME: its length is a hint, checked like the others, then the frame is walked
        need(8, "a frame length");
        need(b.get(at, 8, "frame length") + 8, "a frame");
        at += 8;
        continue;
      default:
        SHOAL_THROW(InvalidArgument, "not a readable archive: {} has unknown pickle opcode 0x{:02x}",
                    name, op);
    }
    need(n, "an argument");
    at += n;
    if (op == '.') return;
  }
}

}  // namespace

void checkArchiveBounds(std::string_view archive) {
  const Bytes b(archive);
  const Directory d = findDirectory(b);
  uint64_t at = d.offset, total = 0;
  for (uint64_t i = 0; i < d.entries; ++i) {
    if (at + kCentralHeaderBytes > d.offset + d.bytes ||
        b.get(at, 4, "directory entry") != kCentralHeader) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: directory entry {} is malformed", i);
    }
    const uint64_t method = b.get(at + 10, 2, "method");
    uint64_t compressed = b.get(at + 20, 4, "compressed size");
    uint64_t uncompressed = b.get(at + 24, 4, "size");
    const uint64_t nameLen = b.get(at + 28, 2, "name length");
    const uint64_t extraLen = b.get(at + 30, 2, "extra length");
    const uint64_t commentLen = b.get(at + 32, 2, "comment length");
    uint64_t local = b.get(at + 42, 4, "entry offset");
    const uint64_t next = at + kCentralHeaderBytes + nameLen + extraLen + commentLen;
    if (next > d.offset + d.bytes) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: directory entry {} overruns it", i);
    }
    readZip64Extra(b, at + kCentralHeaderBytes + nameLen, extraLen, uncompressed, compressed,
                   local);
    // The entry's data, behind its local header, must lie before the directory.
    if (local > d.offset || d.offset - local < kLocalHeaderBytes ||
        b.get(local, 4, "entry header") != kLocalHeader) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: entry {} has no header at byte {}", i,
                  local);
    }
    const uint64_t data = local + kLocalHeaderBytes + b.get(local + 26, 2, "name length") +
                          b.get(local + 28, 2, "extra length");
    if (data > d.offset || compressed > d.offset - data) {
      SHOAL_THROW(InvalidArgument,
                  "not a readable archive: entry {} claims {} bytes at byte {}, past the data ({} "
                  "bytes)",
                  i, compressed, data, d.offset);
    }
    if (method == 0 ? uncompressed != compressed
                    : method != 8 || uncompressed / kMaxDeflateRatio > compressed) {
      SHOAL_THROW(InvalidArgument,
                  "not a readable archive: entry {} claims {} bytes from {} stored (method {})", i,
                  uncompressed, compressed, method);
    }
    const std::string_view name =
        archive.substr(static_cast<size_t>(at + kCentralHeaderBytes), static_cast<size_t>(nameLen));
    if (name.size() >= 4 && name.substr(name.size() - 4) == ".pkl") {
      if (method != 0) {
        SHOAL_THROW(InvalidArgument, "not a readable archive: {} is compressed (libtorch stores it)",
                    name);
      }
      checkPickleLengths(name, b, data, compressed);  // Note [Pickle lengths]
    }
    total += uncompressed;
    if (total / kMaxDeflateRatio > b.size()) {
      SHOAL_THROW(InvalidArgument, "not a readable archive: entries claim {} bytes in all", total);
    }
    at = next;
  }
}

}  // namespace shoal::train
