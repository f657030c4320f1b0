// The decoders of sharded checkpoints (train/shard_format.h): a manifest's payload
// (decodeManifest) and a rank file's header and index checked against a manifest
// (decodeRankIndex). Input: one mode byte, then
//   bit 0 clear: the manifest's payload;
//   bit 0 set:   two bytes giving the manifest's length, the manifest's payload, then the rank
//                file (the whole file: its size is the input's). Bit 1 set: the target writes
//                the index's SHA-256 into the header, bit 2 set: the payload length too, so the
//                fuzzer explores the index behind a header that holds.
//
// Oracle: a typed error, or for a manifest one that re-encodes and decodes to itself, with a
// world size in [1, 2^24] and every tensor of a known dtype and a valid shape; for a rank index
// entries naming tensors of the manifest whose elements and bytes lie inside the tensor and
// inside the file's data.
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "train/shard_format.h"

using namespace shoal;
using namespace shoal::train::shard_format;

namespace {

constexpr const char* kTarget = "shard_index";

bool sameManifest(const Manifest& a, const Manifest& b) {
  if (a.step != b.step || a.files.size() != b.files.size() ||
      a.tensors.size() != b.tensors.size() || a.meta != b.meta) {
    return false;
  }
  for (size_t i = 0; i < a.files.size(); ++i) {
    const auto &x = a.files[i], &y = b.files[i];
    if (x.name != y.name || x.size != y.size || x.sha256 != y.sha256) return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape) return false;
  }
  return true;
}

void checkManifest(const Manifest& m) {
  if (m.files.empty() || m.files.size() > (1u << 24)) fuzz::finding(kTarget, "bad world size");
  for (const auto& f : m.files) {
    if (f.sha256.size() != 32) fuzz::finding(kTarget, "a file digest not 32 bytes");
  }
  for (const auto& t : m.tensors) {
    if (!dtypeFromName(t.dtype) || !numelOf(t.shape)) {
      fuzz::finding(kTarget, "a tensor of unknown dtype or bad shape accepted");
    }
  }
  if (!sameManifest(decodeManifest(encodeManifest(m), "re-encoded"), m)) {
    fuzz::finding(kTarget, "a manifest does not survive re-encoding");
  }
}

void checkEntries(const std::vector<IndexEntry>& entries, const Manifest& m, uint64_t fileSize,
                  std::string_view file) {
  uint64_t indexLen = 0;
  std::memcpy(&indexLen, file.data() + kSealedHead + 16, 8);
  const uint64_t dataStart = kSealedHead + kShardHead + indexLen;
  const uint64_t dataEnd = fileSize - kSealedTail;
  for (const auto& e : entries) {
    const Manifest::Tensor* t = nullptr;
    for (const auto& x : m.tensors) {
      if (x.name == e.name) {
        t = &x;
        break;
      }
    }
    if (!t) fuzz::finding(kTarget, "an entry of a tensor not in the manifest");
    const int64_t total = *numelOf(t->shape);
    if (e.offset < 0 || e.numel < 0 || e.offset > total - e.numel) {
      fuzz::finding(kTarget, "an entry's elements outside its tensor");
    }
    const uint64_t bytes = uint64_t(e.numel) * c10::elementSize(*dtypeFromName(t->dtype));
    if (e.bytePos < dataStart || e.bytePos > dataEnd || bytes > dataEnd - e.bytePos) {
      fuzz::finding(kTarget, "an entry's bytes outside the file's data");
    }
    if (e.sha256.size() != 32) fuzz::finding(kTarget, "an entry's digest not 32 bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!(mode & 1)) {
    Manifest m;
    if (fuzz::expectTypedErrors(kTarget, [&] { m = decodeManifest(rest, "manifest"); })) {
      checkManifest(m);
    }
    return 0;
  }
  if (rest.size() < 2) return 0;
  const size_t split =
      std::min<size_t>(rest.size() - 2, size_t(uint8_t(rest[0])) << 8 | uint8_t(rest[1]));
  Manifest m;
  if (!fuzz::expectTypedErrors(kTarget,
                               [&] { m = decodeManifest(rest.substr(2, split), "manifest"); })) {
    return 0;
  }
  std::string file(rest.substr(2 + split));
  const uint64_t head = kSealedHead + kShardHead;
  if (file.size() >= head) {
    if (mode & 4) {
      const uint64_t payloadLen = file.size() - kSealedHead - kSealedTail;
      std::memcpy(file.data() + 8, &payloadLen, 8);
    }
    if (mode & 2) {
      uint64_t indexLen = 0;
      std::memcpy(&indexLen, file.data() + kSealedHead + 16, 8);
      indexLen = std::min<uint64_t>(indexLen, file.size() - head);
      const std::string sha = sha256(file.data() + head, indexLen);
      std::memcpy(file.data() + kSealedHead + 24, sha.data(), sha.size());
    }
  }
  std::vector<IndexEntry> entries;
  if (fuzz::expectTypedErrors(kTarget,
                              [&] { entries = decodeRankIndex(file, file.size(), m, "rank"); })) {
    checkEntries(entries, m, file.size(), file);
  }
  return 0;
}
