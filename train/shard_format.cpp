#include "train/shard_format.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "common/sealed_file.h"

namespace shoal::train::shard_format {

namespace fs = std::filesystem;

std::optional<std::string> dtypeName(torch::ScalarType t) {
  for (auto& [type, name] : kDtypes) {
    if (type == t) return std::string(name);
  }
  return std::nullopt;
}

std::optional<torch::ScalarType> dtypeFromName(const std::string& n) {
  for (auto& [type, name] : kDtypes) {
    if (n == name) return type;
  }
  return std::nullopt;
}

std::string sha256(const void* data, size_t n) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(static_cast<const unsigned char*>(data), n,
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

std::string stepFolder(const std::string& dir, int64_t step) {
  return fmt::format("{}/step-{:08d}", dir, step);
}

std::string rankFileName(int rank, int world) {
  return fmt::format("rank-{}-of-{}.shard", rank, world);
}

std::optional<int64_t> numelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > (int64_t{1} << 62) / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string describe(const std::string& dtype, const std::vector<int64_t>& shape) {
  return fmt::format("{} [{}]", dtype, fmt::join(shape, ", "));
}

void putShape(Encoder& e, const std::vector<int64_t>& shape) {
  e.put<uint64_t>(shape.size());
  for (int64_t d : shape) e.put<int64_t>(d);
}

std::vector<int64_t> getShape(Decoder& d) {
  std::vector<int64_t> shape(d.count(8));
  for (auto& x : shape) x = d.get<int64_t>();
  if (!numelOf(shape)) d.fail(fmt::format("bad shape [{}]", fmt::join(shape, ", ")));
  return shape;
}

std::string encodeManifest(const Manifest& m) {
  Encoder e;
  e.raw(std::string(kManifestMagic, 8));
  e.put<uint32_t>(kVersion);
  e.put<int64_t>(m.step);
  e.put<uint64_t>(m.files.size());
  for (const auto& f : m.files) {
    e.str(f.name);
    e.put<uint64_t>(f.size);
    e.raw(f.sha256);
  }
  e.put<uint64_t>(m.tensors.size());
  for (const auto& t : m.tensors) {
    e.str(t.name);
    e.str(t.dtype);
    putShape(e, t.shape);
  }
  e.put<uint64_t>(m.meta.size());
  for (const auto& [k, v] : m.meta) {
    e.str(k);
    e.str(v);
  }
  return std::move(e.bytes());
}

Manifest decodeManifest(std::string_view bytes, const std::string& source) {
  Decoder d(bytes, source);
  if (d.raw(8) != std::string(kManifestMagic, 8)) d.fail("not a Shoal checkpoint manifest");
  if (uint32_t v = d.get<uint32_t>(); v != kVersion) {
    d.fail(fmt::format("version {}, this Shoal reads version {}", v, kVersion));
  }
  Manifest m;
  m.step = d.get<int64_t>();
  m.files.resize(d.count(8 + 8 + SHA256_DIGEST_LENGTH));
  if (m.files.empty() || m.files.size() > (1u << 24)) {
    d.fail(fmt::format("a world size of {}", m.files.size()));
  }
  for (auto& f : m.files) {
    f.name = d.str();
    f.size = d.get<uint64_t>();
    f.sha256 = d.raw(SHA256_DIGEST_LENGTH);
  }
  m.tensors.resize(d.count(8 + 8 + 8));
  for (auto& t : m.tensors) {
    t.name = d.str();
    t.dtype = d.str();
    t.shape = getShape(d);
    if (!dtypeFromName(t.dtype))
      d.fail(fmt::format("'{}' has unknown dtype '{}'", t.name, t.dtype));
  }
  const uint64_t metas = d.count(16);
  for (uint64_t i = 0; i < metas; ++i) {
    std::string k = d.str();
    m.meta[k] = d.str();
  }
  if (!d.done()) d.fail("trailing bytes");
  return m;
}

Manifest readManifest(const std::string& path) {
  const std::string bytes = readSealedFile(path);  // length and SHA-256 checked
  return decodeManifest(bytes, "checkpoint manifest " + path);
}

RankHeader decodeRankHeader(std::string_view head, uint64_t fileSize, const std::string& what) {
  Decoder h(head, what);
  if (fileSize < kSealedHead + kShardHead + kSealedTail) {
    h.fail(fmt::format("{} bytes, too short for a rank file", fileSize));
  }
  h.raw(8);  // the sealed magic
  RankHeader r;
  r.payloadLen = h.get<uint64_t>();
  if (r.payloadLen != fileSize - kSealedHead - kSealedTail) {
    h.fail(fmt::format("the header says {} bytes of payload, the file holds {}", r.payloadLen,
                       fileSize - kSealedHead - kSealedTail));
  }
  if (h.raw(8) != std::string(kShardMagic, 8)) h.fail("not a Shoal rank file");
  if (uint32_t v = h.get<uint32_t>(); v != kVersion) {
    h.fail(fmt::format("version {}, this Shoal reads version {}", v, kVersion));
  }
  h.get<uint32_t>();
  r.indexLen = h.get<uint64_t>();
  r.indexSha = h.raw(SHA256_DIGEST_LENGTH);
  if (r.indexLen > r.payloadLen - kShardHead) {
    h.fail(fmt::format("an index of {} bytes in a payload of {}", r.indexLen, r.payloadLen));
  }
  return r;
}

std::vector<IndexEntry> decodeRankIndex(std::string_view bytes, uint64_t fileSize,
                                        const Manifest& m, const std::string& what) {
  const RankHeader h = decodeRankHeader(bytes.substr(0, kSealedHead + kShardHead), fileSize, what);
  const uint64_t indexStart = kSealedHead + kShardHead;
  if (bytes.size() - indexStart < h.indexLen) {
    SHOAL_THROW(InvalidArgument, "{}: truncated: an index of {} bytes, {} given", what, h.indexLen,
                bytes.size() - indexStart);
  }
  const std::string_view index = bytes.substr(indexStart, h.indexLen);
  if (sha256(index.data(), index.size()) != h.indexSha) {
    SHOAL_THROW(InvalidArgument, "{}: the index fails its checksum (the file is corrupt)", what);
  }
  std::map<std::string_view, const Manifest::Tensor*> tensors;
  for (const auto& t : m.tensors) tensors.try_emplace(t.name, &t);
  Decoder d(index, what);
  const uint64_t payloadLen = h.payloadLen;
  const uint64_t dataStart = kShardHead + h.indexLen;
  std::vector<IndexEntry> out;
  // Name, dtype, ndim, offset, numel, position, digest: 80 bytes at least per piece.
  const uint64_t n = d.count(6 * 8 + SHA256_DIGEST_LENGTH);
  out.reserve(n);
  for (uint64_t k = 0; k < n; ++k) {
    IndexEntry p;
    p.name = d.str();
    const std::string dtype = d.str();
    const auto shape = getShape(d);
    p.offset = d.get<int64_t>();
    p.numel = d.get<int64_t>();
    const uint64_t at = d.get<uint64_t>();
    p.sha256 = d.raw(SHA256_DIGEST_LENGTH);
    auto it = tensors.find(p.name);
    if (it == tensors.end()) d.fail(fmt::format("'{}' is not in the manifest", p.name));
    const Manifest::Tensor& t = *it->second;
    const auto type = dtypeFromName(t.dtype);
    const auto total = numelOf(t.shape);
    if (!type || !total) {
      d.fail(fmt::format("'{}' is {} in the manifest", p.name, describe(t.dtype, t.shape)));
    }
    if (dtype != t.dtype || shape != t.shape) {
      d.fail(fmt::format("'{}' is {}, the manifest says {}", p.name, describe(dtype, shape),
                         describe(t.dtype, t.shape)));
    }
    if (p.offset < 0 || p.numel < 0 || p.offset > *total - p.numel) {
      int64_t end = 0;  // printed only: an overflowing end is shown as such
      const bool over = __builtin_add_overflow(p.offset, p.numel, &end);
      d.fail(fmt::format("a piece of '{}' at elements [{}, {}) is past its end ({})", p.name,
                         p.offset, over ? "overflow" : std::to_string(end), *total));
    }
    const uint64_t elem = c10::elementSize(*type);
    if (static_cast<uint64_t>(p.numel) > payloadLen / elem) {
      d.fail(
          fmt::format("a piece of '{}' of {} elements is larger than the file", p.name, p.numel));
    }
    const uint64_t bytes = static_cast<uint64_t>(p.numel) * elem;
    if (at < dataStart || at > payloadLen || bytes > payloadLen - at) {
      d.fail(fmt::format("the piece of '{}' lies at bytes [{}, {}), outside the data [{}, {})",
                         p.name, at, at + bytes, dataStart, payloadLen));
    }
    p.bytePos = kSealedHead + at;
    out.push_back(std::move(p));
  }
  if (!d.done()) d.fail("trailing bytes after the index");
  return out;
}

std::vector<std::pair<int64_t, std::string>> stepFolders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= 5 || name.rfind("step-", 0) != 0 || name.size() > 5 + 18) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(digits), it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace shoal::train::shard_format
