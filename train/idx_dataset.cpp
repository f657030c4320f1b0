#include "train/idx_dataset.h"

#include <zlib.h>

#include <cstdint>
#include <vector>

#include "common/error.h"

namespace shoal::train {

namespace {

// The whole decompressed file; InvalidArgument for a missing file or a broken gzip stream.
std::vector<uint8_t> readGzip(const std::string& path) {
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (!f)
    SHOAL_THROW(InvalidArgument, "{}: cannot open (is dataset-fashion-mnist installed?)", path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = ::gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string what = ::gzerror(f, &err);
      ::gzclose(f);
      SHOAL_THROW(InvalidArgument, "{}: corrupt gzip data after {} bytes: {}", path, out.size(),
                  what);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  // gzread reports a stream cut short as end of file; gzclose's status tells the difference.
  int rc = ::gzclose(f);
  if (rc != Z_OK) {
    SHOAL_THROW(InvalidArgument, "{}: truncated or corrupt gzip stream (zlib status {})", path, rc);
  }
  return out;
}

uint32_t bigEndian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) |
         uint32_t(b[at + 3]);
}

// Checks the header (magic 0x000008<dims>, unsigned bytes) and that the data is exactly as long
// as the dimensions say. Returns the dimensions.
std::vector<int64_t> checkHeader(const std::vector<uint8_t>& b, const std::string& path, int dims) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (b.size() < header) {
    SHOAL_THROW(InvalidArgument, "{}: {} bytes is too short for an IDX header", path, b.size());
  }
  const uint32_t magic = bigEndian(b, 0);
  if (magic != (0x800u | static_cast<uint32_t>(dims))) {
    SHOAL_THROW(InvalidArgument,
                "{}: magic number 0x{:08x}, expected 0x{:08x} (unsigned bytes, {} "
                "dimensions)",
                path, magic, 0x800u | dims, dims);
  }
  std::vector<int64_t> shape;
  size_t expected = 1;
  for (int d = 0; d < dims; ++d) {
    const uint32_t n = bigEndian(b, 4 + 4 * static_cast<size_t>(d));
    if (n == 0 || n > (1u << 24)) {
      SHOAL_THROW(InvalidArgument, "{}: dimension {} is {}", path, d, n);
    }
    shape.push_back(n);
    expected *= n;
  }
  if (b.size() - header != expected) {
    SHOAL_THROW(InvalidArgument, "{}: the header promises {} bytes of data, the file has {} ({})",
                path, expected, b.size() - header,
                b.size() - header < expected ? "truncated" : "trailing garbage");
  }
  return shape;
}

}  // namespace

IdxDataset readIdxDataset(const std::string& dir, const std::string& prefix) {
  const std::string imagesPath = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labelsPath = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto images = readGzip(imagesPath);
  auto labels = readGzip(labelsPath);
  auto ishape = checkHeader(images, imagesPath, 3);
  auto lshape = checkHeader(labels, labelsPath, 1);
  if (ishape[0] != lshape[0]) {
    SHOAL_THROW(InvalidArgument, "{} holds {} images but {} holds {} labels", imagesPath, ishape[0],
                labelsPath, lshape[0]);
  }
  for (size_t i = 8; i < labels.size(); ++i) {
    if (labels[i] > 9) {
      SHOAL_THROW(InvalidArgument, "{}: label {} of item {} is outside 0..9", labelsPath,
                  int(labels[i]), i - 8);
    }
  }
  IdxDataset d;
  auto raw =
      torch::from_blob(images.data() + 16, {ishape[0], 1, ishape[1], ishape[2]}, torch::kUInt8);
  // Fashion-MNIST's training-set mean and standard deviation.
  d.images = (raw.to(torch::kFloat32) / 255.0f - 0.2860f) / 0.3530f;
  d.labels = torch::from_blob(labels.data() + 8, {lshape[0]}, torch::kUInt8).to(torch::kInt64);
  return d;
}

}  // namespace shoal::train
