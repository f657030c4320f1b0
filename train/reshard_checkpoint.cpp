#include "train/reshard_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "common/error.h"
#include "common/sealed_file.h"
#include "train/shard_format.h"

namespace shoal::train {

namespace fs = std::filesystem;
using namespace shard_format;

namespace {

// Reads exactly n bytes at `at` of an open file; InvalidArgument naming it otherwise.
void preadExactly(int fd, void* into, uint64_t n, uint64_t at, const std::string& what) {
  uint64_t done = 0;
  while (done < n) {
    ssize_t r =
        ::pread(fd, static_cast<char*>(into) + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      SHOAL_THROW(InvalidArgument, "{}: read failed at byte {} ({})", what, at + done,
                  r < 0 ? std::strerror(errno) : "the file shrank while being read");
    }
    done += static_cast<uint64_t>(r);
  }
}

class File {
 public:
  File(const std::string& path, const std::string& what) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      SHOAL_THROW(InvalidArgument, "{}: cannot be read ({})", what, std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace

std::optional<int64_t> ShardReader::latestStep(const std::string& dir) {
  auto all = stepFolders(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string manifest = it->second + "/manifest";
    if (!fs::exists(manifest)) continue;  // never committed
    const Manifest m = readManifest(manifest);
    if (m.step != it->first) {
      SHOAL_THROW(InvalidArgument, "checkpoint manifest {}: records step {}, not {}", manifest,
                  m.step, it->first);
    }
    return it->first;
  }
  return std::nullopt;
}

namespace {

// For the error of a damaged step: the newest older committed step that opens, so the user
// learns what a resume could use instead (never loaded silently: the error stands).
std::string offerOlder(const std::string& dir, int64_t step) {
  const auto all = stepFolders(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first >= step || !fs::exists(it->second + "/manifest")) continue;
    try {
      ShardReader older(dir, it->first);
      return fmt::format("; the newest intact checkpoint is {} (move {} away to resume from it)",
                         it->second, stepFolder(dir, step));
    } catch (const InvalidArgument&) {
      // Damaged too: look further back.
    }
  }
  return "; no older intact checkpoint in " + dir;
}

}  // namespace

// A function-try-block: any structural damage found while opening is reported with the newest
// older step that is intact.
ShardReader::ShardReader(const std::string& dir, int64_t step) try
    : stepDir_(stepFolder(dir, step)), step_(step) {
  const std::string manifestPath = stepDir_ + "/manifest";
  if (!fs::exists(manifestPath)) {
    SHOAL_THROW(InvalidArgument, "checkpoint step {} in {}: not committed (no {})", step, dir,
                manifestPath);
  }
  Manifest m = readManifest(manifestPath);
  if (m.step != step) {
    SHOAL_THROW(InvalidArgument, "checkpoint manifest {}: records step {}, not {}", manifestPath,
                m.step, step);
  }
  worldSize_ = static_cast<int>(m.files.size());
  meta_ = std::move(m.meta);
  for (auto& t : m.tensors) {
    Entry e;
    e.dtype = *dtypeFromName(t.dtype);
    e.shape = t.shape;
    e.numel = *numelOf(t.shape);
    if (!tensors_.emplace(t.name, std::move(e)).second) {
      SHOAL_THROW(InvalidArgument, "checkpoint manifest {}: '{}' is listed twice", manifestPath,
                  t.name);
    }
  }
  for (int r = 0; r < worldSize_; ++r) {
    const auto& f = m.files[r];
    const std::string expected = rankFileName(r, worldSize_);
    if (f.name != expected) {
      SHOAL_THROW(InvalidArgument, "checkpoint manifest {}: rank {}'s file is '{}', not '{}'",
                  manifestPath, r, f.name, expected);
    }
    const std::string path = stepDir_ + "/" + f.name;
    files_.push_back(path);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      SHOAL_THROW(InvalidArgument, "checkpoint {} (written by rank {} of {}) is missing ({})", path,
                  r, worldSize_, std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != f.size) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint {} (written by rank {} of {}): {} bytes, the manifest records {} "
                  "(truncated or replaced)",
                  path, r, worldSize_, st.st_size, f.size);
    }
    const std::string what =
        fmt::format("checkpoint {} (written by rank {} of {})", path, r, worldSize_);
    File file(path, what);
    // The sealed trailer ties the file to this manifest: a rank file from another save of the
    // same step and size is refused here rather than read as this one.
    std::string trailer(SHA256_DIGEST_LENGTH, '\0');
    if (f.size < kSealedHead + kShardHead + kSealedTail) {
      SHOAL_THROW(InvalidArgument, "{}: {} bytes, too short for a rank file", what, f.size);
    }
    preadExactly(file.fd(), trailer.data(), kSealedTail, f.size - kSealedTail, what);
    if (trailer != f.sha256) {
      SHOAL_THROW(InvalidArgument, "{}: not the file the manifest committed (its checksum differs)",
                  what);
    }
    readIndex(r, m);
  }
  for (auto& [name, e] : tensors_) {
    std::sort(e.pieces.begin(), e.pieces.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.offset, a.rank) < std::tie(b.offset, b.rank);
    });
  }
} catch (const InvalidArgument& e) {
  throw InvalidArgument(e.what() + offerOlder(dir, step));
}

void ShardReader::readIndex(int rank, const Manifest& m) {
  const std::string& path = files_[rank];
  const std::string what =
      fmt::format("checkpoint {} (written by rank {} of {})", path, rank, worldSize_);
  File file(path, what);
  struct stat st {};
  if (::fstat(file.fd(), &st) != 0) SHOAL_THROW(InvalidArgument, "{}: cannot be read", what);
  const uint64_t size = static_cast<uint64_t>(st.st_size);  // checked against the manifest
  // The header, then the index it sizes: decodeRankIndex checks them both.
  std::string bytes(kSealedHead + kShardHead, '\0');
  preadExactly(file.fd(), bytes.data(), bytes.size(), 0, what);
  const RankHeader h = decodeRankHeader(bytes, size, what);
  bytes.resize(kSealedHead + kShardHead + h.indexLen);
  preadExactly(file.fd(), bytes.data() + kSealedHead + kShardHead, h.indexLen,
               kSealedHead + kShardHead, what);
  for (auto& i : decodeRankIndex(bytes, size, m, what)) {
    if (i.numel == 0) continue;
    Piece p;
    p.rank = rank;
    p.offset = i.offset;
    p.numel = i.numel;
    p.bytePos = i.bytePos;
    p.sha256 = std::move(i.sha256);
    tensors_.at(i.name).pieces.push_back(std::move(p));
  }
}

const ShardReader::Entry& ShardReader::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    SHOAL_THROW(InvalidArgument, "checkpoint {}: holds no tensor '{}'", stepDir_, name);
  }
  return it->second;
}

std::vector<std::string> ShardReader::names() const {
  std::vector<std::string> out;
  for (auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

bool ShardReader::has(const std::string& name) const {
  return tensors_.count(name) > 0;
}

std::vector<int64_t> ShardReader::shape(const std::string& name) const {
  return entry(name).shape;
}

torch::ScalarType ShardReader::dtype(const std::string& name) const {
  return entry(name).dtype;
}

int64_t ShardReader::numel(const std::string& name) const {
  return entry(name).numel;
}

void ShardReader::read(const std::string& name, int64_t offset, torch::Tensor out) const {
  const Entry& e = entry(name);
  SHOAL_CHECK(out.defined() && out.device().is_cpu() && out.dim() == 1 && out.is_contiguous(),
              "reading '{}': the output must be a 1-D contiguous CPU tensor", name);
  if (out.scalar_type() != e.dtype) {
    SHOAL_THROW(InvalidArgument, "reading '{}': the output is {}, the tensor {}", name,
                c10::toString(out.scalar_type()), c10::toString(e.dtype));
  }
  const int64_t end = offset + out.numel();
  if (offset < 0 || offset > e.numel - out.numel()) {
    SHOAL_THROW(InvalidArgument, "reading '{}': elements [{}, {}) are outside its {} elements",
                name, offset, end, e.numel);
  }
  const size_t elem = c10::elementSize(e.dtype);
  char* dst = static_cast<char*>(out.data_ptr());
  std::string bytes;
  int64_t cursor = offset;
  while (cursor < end) {
    // The first piece (in offset, rank order) covering `cursor` (Note [Coverage] in
    // save_shards.cpp).
    const Piece* piece = nullptr;
    int64_t nextStart = end;
    for (const auto& p : e.pieces) {
      if (p.offset <= cursor && cursor < p.offset + p.numel) {
        piece = &p;
        break;
      }
      if (p.offset > cursor) nextStart = std::min(nextStart, p.offset);
    }
    if (!piece) {
      SHOAL_THROW(InvalidArgument,
                  "checkpoint {}: elements [{}, {}) of '{}' are in no shard (a rank file missing "
                  "or written wrong?)",
                  stepDir_, cursor, nextStart, name);
    }
    const std::string& path = files_[piece->rank];
    const std::string what =
        fmt::format("checkpoint {} (written by rank {} of {})", path, piece->rank, worldSize_);
    // The whole piece is read: its checksum covers all of it.
    bytes.resize(static_cast<size_t>(piece->numel) * elem);
    {
      File file(path, what);
      preadExactly(file.fd(), bytes.data(), bytes.size(), piece->bytePos, what);
    }
    if (sha256(bytes.data(), bytes.size()) != piece->sha256) {
      SHOAL_THROW(InvalidArgument,
                  "{}: the piece of '{}' at elements [{}, {}) fails its checksum (the file is "
                  "corrupt)",
                  what, name, piece->offset, piece->offset + piece->numel);
    }
    const int64_t upto = std::min(end, piece->offset + piece->numel);
    std::memcpy(dst + (cursor - offset) * elem, bytes.data() + (cursor - piece->offset) * elem,
                static_cast<size_t>(upto - cursor) * elem);
    cursor = upto;
  }
}

torch::Tensor ShardReader::readFull(const std::string& name) const {
  const Entry& e = entry(name);
  auto out = torch::empty({e.numel}, torch::TensorOptions().dtype(e.dtype));
  read(name, 0, out);
  return out.view(e.shape);
}

}  // namespace shoal::train
