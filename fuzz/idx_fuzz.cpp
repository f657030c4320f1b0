// The IDX reader (train/idx_dataset.h): an images file and a labels file, gzip-compressed as
// Debian ships them. Input: one mode byte, two bytes giving where the images end, then the two
// files' contents. Mode bit 0 set: the contents are written as they are (exercising the gzip
// layer with arbitrary bytes); clear: they are gzip-compressed first, so the fuzzer explores the
// IDX headers and data behind a valid stream.
//
// Oracle: a typed error, or a dataset whose shapes agree with each other and with the files.
#include <zlib.h>

#include <cmath>

#include "fuzz/fuzz_util.h"
#include "train/idx_dataset.h"

using namespace shoal;

namespace {

void writeGzip(const std::string& path, std::string_view bytes) {
  gzFile f = ::gzopen(path.c_str(), "wb1");
  if (!f) shoal::fuzz::finding("idx", "gzopen for writing failed");
  if (!bytes.empty() &&
      ::gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != int(bytes.size())) {
    shoal::fuzz::finding("idx", "gzwrite failed");
  }
  if (::gzclose(f) != Z_OK) shoal::fuzz::finding("idx", "gzclose failed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "idx";
  if (size < 3) return 0;
  const bool raw = data[0] & 1;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  const size_t split = std::min<size_t>(rest.size(), size_t(data[1]) << 8 | data[2]);
  const std::string dir = fuzz::scratchDir();
  const std::string images = dir + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = dir + "/t10k-labels-idx1-ubyte.gz";
  if (raw) {
    fuzz::writeFile(images, rest.substr(0, split));
    fuzz::writeFile(labels, rest.substr(split));
  } else {
    writeGzip(images, rest.substr(0, split));
    writeGzip(labels, rest.substr(split));
  }
  train::IdxDataset d;
  if (fuzz::expectTypedErrors(kTarget, [&] { d = train::readIdxDataset(dir, "t10k"); })) {
    SHOAL_FUZZ_CHECK(kTarget, d.images.dim() == 4 && d.labels.dim() == 1);
    SHOAL_FUZZ_CHECK(kTarget, d.images.size(0) == d.labels.size(0) && d.images.size(1) == 1);
    SHOAL_FUZZ_CHECK(kTarget,
                     d.labels.min().item<int64_t>() >= 0 && d.labels.max().item<int64_t>() <= 9);
    SHOAL_FUZZ_CHECK(kTarget, std::isfinite(d.images.sum().item<double>()));
  }
  return 0;
}
