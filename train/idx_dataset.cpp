#include "train/idx_dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/error.h"

namespace shoal::train {

namespace {

// IDX data larger than this is refused before it is read: Fashion-MNIST's training images are
// 47 MB; a header (or a gzip bomb) claiming more is not a dataset this reader serves (as
// float32 it would take 4 GiB).
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 30;

// An open gzip stream, closed on every path.
class GzipFile {
 public:
  explicit GzipFile(const std::string& path) : path_(path), f_(::gzopen(path.c_str(), "rb")) {
    if (!f_) {
      SHOAL_THROW(InvalidArgument, "{}: cannot open (is dataset-fashion-mnist installed?)", path);
    }
  }
  ~GzipFile() {
    if (f_) ::gzclose(f_);
  }
  GzipFile(const GzipFile&) = delete;
  GzipFile& operator=(const GzipFile&) = delete;

  // Up to n bytes (fewer only at the end of the stream).
  size_t read(uint8_t* into, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      int got = ::gzread(f_, into + done, chunk);
      if (got < 0) {
        int err = 0;
        std::string what = ::gzerror(f_, &err);
        SHOAL_THROW(InvalidArgument, "{}: corrupt gzip data after {} bytes: {}", path_,
                    total_ + done, what);
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    total_ += done;
    return done;
  }
  // gzread reports a stream cut short as end of file; gzclose's status tells the difference.
  void close() {
    if (!f_) return;
    int rc = ::gzclose(f_);
    f_ = nullptr;
    if (rc != Z_OK) {
      SHOAL_THROW(InvalidArgument, "{}: truncated or corrupt gzip stream (zlib status {})", path_,
                  rc);
    }
  }

 private:
  std::string path_;
  gzFile f_;
  uint64_t total_ = 0;
};

uint32_t bigEndian(const uint8_t* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

struct IdxFile {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // exactly the product of shape bytes
};

// Reads the header (magic 0x000008<dims>, unsigned bytes), checks the dimensions against
// kMaxIdxBytes, and only then allocates and reads the data, which must be exactly as long as
// the dimensions say: the decompressed size is never trusted to be small.
IdxFile readIdx(const std::string& path, int dims) {
  GzipFile f(path);
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  uint8_t h[4 + 4 * 3];
  const size_t got = f.read(h, header);
  if (got < header) {
    f.close();
    SHOAL_THROW(InvalidArgument, "{}: {} bytes is too short for an IDX header", path, got);
  }
  const uint32_t magic = bigEndian(h);
  if (magic != (0x800u | static_cast<uint32_t>(dims))) {
    SHOAL_THROW(InvalidArgument,
                "{}: magic number 0x{:08x}, expected 0x{:08x} (unsigned bytes, {} "
                "dimensions)",
                path, magic, 0x800u | dims, dims);
  }
  IdxFile out;
  uint64_t expected = 1;
  for (int d = 0; d < dims; ++d) {
    const uint32_t n = bigEndian(h + 4 + 4 * d);
    // Each factor is at most 2^32 and the running product at most kMaxIdxBytes (2^30), so the
    // product cannot wrap before it is compared.
    if (n == 0 || expected * n > kMaxIdxBytes) {
      SHOAL_THROW(InvalidArgument,
                  "{}: dimension {} is {}: the data would be {} bytes or more, the limit is {}",
                  path, d, n, expected * std::max<uint64_t>(n, 1), kMaxIdxBytes);
    }
    out.shape.push_back(n);
    expected *= n;
  }
  // Grow as the data arrives: a 60-byte file whose header promises 1 GiB costs what it holds,
  // not what it claims.
  size_t have = 0;
  for (size_t chunk = 1 << 20; have < expected; chunk = std::min<size_t>(chunk * 2, 64 << 20)) {
    const size_t want = std::min<size_t>(chunk, expected - have);
    out.data.resize(have + want);
    const size_t got = f.read(out.data.data() + have, want);
    have += got;
    if (got < want) break;
  }
  out.data.resize(have);
  uint8_t extra = 0;
  const bool trailing = have == expected && f.read(&extra, 1) == 1;
  if (have != expected || trailing) {
    // A stream cut short reads as a short file: let zlib's verdict on the stream speak first.
    if (!trailing) f.close();
    SHOAL_THROW(InvalidArgument, "{}: the header promises {} bytes of data, the file has {}", path,
                expected,
                trailing ? "more (trailing garbage)" : fmt::format("{} (truncated)", have));
  }
  f.close();
  return out;
}

}  // namespace

IdxDataset readIdxDataset(const std::string& dir, const std::string& prefix, int64_t limit) {
  const std::string imagesPath = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labelsPath = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto images = readIdx(imagesPath, 3);
  auto labels = readIdx(labelsPath, 1);
  const auto& ishape = images.shape;
  const auto& lshape = labels.shape;
  if (ishape[0] != lshape[0]) {
    SHOAL_THROW(InvalidArgument, "{} holds {} images but {} holds {} labels", imagesPath, ishape[0],
                labelsPath, lshape[0]);
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] > 9) {
      SHOAL_THROW(InvalidArgument, "{}: label {} of item {} is outside 0..9", labelsPath,
                  int(labels.data[i]), i);
    }
  }
  const int64_t n = limit > 0 ? std::min<int64_t>(limit, ishape[0]) : ishape[0];
  IdxDataset d;
  auto raw = torch::from_blob(images.data.data(), {n, 1, ishape[1], ishape[2]}, torch::kUInt8);
  // Fashion-MNIST's training-set mean and standard deviation. In place: one float copy of the
  // images, not one per operation.
  d.images = raw.to(torch::kFloat32);
  d.images.div_(255.0f).sub_(0.2860f).div_(0.3530f);
  d.labels = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return d;
}

}  // namespace shoal::train
