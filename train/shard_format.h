// The on-disk format of sharded checkpoints (train/reshard_checkpoint.h): names, the
// little-endian codec of rank-file indexes and manifests, and the manifest itself. Internal to
// train/: saving (save_shards.cpp) and reading (reshard_checkpoint.cpp) share it.
#pragma once

#include <fmt/format.h>
#include <openssl/sha.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace shoal::train::shard_format {

inline constexpr char kShardMagic[8] = {'S', 'H', 'O', 'A', 'L', 'S', 'H', 'D'};
inline constexpr char kManifestMagic[8] = {'S', 'H', 'O', 'A', 'L', 'M', 'A', 'N'};
inline constexpr uint32_t kVersion = 1;
// The sealed framing around every payload (common/sealed_file.h): magic, length, ..., SHA-256.
inline constexpr uint64_t kSealedHead = 16;
inline constexpr uint64_t kSealedTail = SHA256_DIGEST_LENGTH;
// A rank file's payload header: magic, version, reserved, index length, index SHA-256.
inline constexpr uint64_t kShardHead = 8 + 4 + 4 + 8 + SHA256_DIGEST_LENGTH;

// The dtypes a checkpoint holds, by the name written on disk.
inline constexpr std::array<std::pair<torch::ScalarType, const char*>, 10> kDtypes = {{
    {torch::kFloat32, "float32"},
    {torch::kFloat64, "float64"},
    {torch::kBFloat16, "bfloat16"},
    {torch::kFloat16, "float16"},
    {torch::kInt64, "int64"},
    {torch::kInt32, "int32"},
    {torch::kInt16, "int16"},
    {torch::kInt8, "int8"},
    {torch::kUInt8, "uint8"},
    {torch::kBool, "bool"},
}};

// The name written on disk for a dtype, or nothing for one checkpoints do not hold; and back.
std::optional<std::string> dtypeName(torch::ScalarType t);
std::optional<torch::ScalarType> dtypeFromName(const std::string& n);

std::string sha256(const void* data, size_t n);                // 32 bytes
std::string stepFolder(const std::string& dir, int64_t step);  // <dir>/step-<8 digits>
std::string rankFileName(int rank, int world);                 // rank-<r>-of-<N>.shard
// Element count of `shape`, or nothing for a negative size or an overflow.
std::optional<int64_t> numelOf(const std::vector<int64_t>& shape);
std::string describe(const std::string& dtype,
                     const std::vector<int64_t>& shape);  // "float32 [2, 3]"

// Little-endian encoding of the index and the manifest (x86-64 and aarch64 are both little
// endian; the bytes are copied as they lie in memory).
class Encoder {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    out_ += s;
  }
  void raw(const std::string& s) { out_ += s; }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Every length and count is checked against the bytes left before it sizes anything.
class Decoder {
 public:
  Decoder(std::string_view in, std::string what) : in_(in), what_(std::move(what)) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() { return raw(get<uint64_t>()); }
  std::string raw(uint64_t n) { return std::string(view(n)); }
  // The next n bytes, not copied (valid while the input is).
  std::string_view view(uint64_t n) {
    need(n);
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // A count of items each at least `minBytes` long.
  uint64_t count(uint64_t minBytes) {
    const uint64_t n = get<uint64_t>();
    if (n > left() / minBytes) fail(fmt::format("a count of {} does not fit in the file", n));
    return n;
  }
  bool done() const { return pos_ == in_.size(); }
  [[noreturn]] void fail(const std::string& what) const {
    SHOAL_THROW(InvalidArgument, "{}: {} (at byte {})", what_, what, pos_);
  }

 private:
  uint64_t left() const { return in_.size() - pos_; }
  void need(uint64_t n) const {
    if (n > left()) fail(fmt::format("truncated: {} bytes needed, {} left", n, left()));
  }

  std::string_view in_;
  size_t pos_ = 0;
  std::string what_;
};

void putShape(Encoder& e, const std::vector<int64_t>& shape);
std::vector<int64_t> getShape(Decoder& d);  // a shape whose element count fits in int64

struct Manifest {
  int64_t step = 0;
  struct File {
    std::string name;
    uint64_t size = 0;
    std::string sha256;
  };
  std::vector<File> files;
  struct Tensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
};

std::string encodeManifest(const Manifest& m);
// Decodes and checks a manifest's payload (what the sealed file holds); InvalidArgument naming
// `source` for anything wrong. Every tensor's dtype is known and its shape's element count fits
// in int64; the world size is in [1, 2^24]. Tensor names are not checked for repeats.
Manifest decodeManifest(std::string_view bytes, const std::string& source);
// Reads and checks a sealed manifest; InvalidArgument naming it for anything wrong.
Manifest readManifest(const std::string& path);

// A rank file's header: the sealed framing's length, then the payload header.
struct RankHeader {
  uint64_t payloadLen = 0;  // = the file's size - kSealedHead - kSealedTail
  uint64_t indexLen = 0;    // <= payloadLen - kShardHead
  std::string indexSha;     // SHA-256 of the index
};
// One entry of a rank file's index: elements [offset, offset + numel) of tensor `name`, whose
// bytes lie at [bytePos, bytePos + numel * element size) of the file, inside its data.
struct IndexEntry {
  std::string name;
  int64_t offset = 0;
  int64_t numel = 0;
  uint64_t bytePos = 0;  // from the start of the file
  std::string sha256;    // of the piece's bytes
};
// Decodes the first kSealedHead + kShardHead bytes of a rank file of `fileSize` bytes (the
// sealed magic is not checked: the manifest's checksum of the file vouches for it).
RankHeader decodeRankHeader(std::string_view head, uint64_t fileSize, const std::string& what);
// Decodes a rank file's header and index from `bytes`, the file's first bytes (at least its
// header and index; the pieces' bytes need not be there), checks the index's checksum and every
// entry against the manifest `m` (name, dtype, shape, elements in range) and against the file
// size (bytes inside the data). InvalidArgument naming `what` for anything wrong.
std::vector<IndexEntry> decodeRankIndex(std::string_view bytes, uint64_t fileSize,
                                        const Manifest& m, const std::string& what);

// The step folders in `dir` ("step-<digits>"), oldest first; none if `dir` does not exist.
std::vector<std::pair<int64_t, std::string>> stepFolders(const std::string& dir);

}  // namespace shoal::train::shard_format
