#include "train/zero/elastic_part.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "common/byte_codec.h"
#include "common/error.h"

namespace shoal::train::zero {

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'Z', 'E', '1'};
constexpr int kMaxDims = 16;
constexpr int64_t kMaxElements = int64_t{1} << 62;

}  // namespace

// One commit's pieces: the progress, the optimizer's step count, then each piece (name, shape,
// offset, dtype, elements).
std::string encodeElasticPart(const ElasticProgress& p, int64_t optimizerStep,
                              const std::vector<FlatPiece>& pieces) {
  std::string out(kMagic, sizeof kMagic);
  putValue<int64_t>(out, p.step);
  putValue<int64_t>(out, p.epoch);
  putValue<int64_t>(out, p.position);
  putValue<int64_t>(out, optimizerStep);
  putValue<uint64_t>(out, pieces.size());
  for (const auto& piece : pieces) {
    putBytes(out, piece.name.data(), piece.name.size());
    putValue<int32_t>(out, static_cast<int32_t>(piece.shape.size()));
    for (auto d : piece.shape) putValue<int64_t>(out, d);
    putValue<int64_t>(out, piece.offset);
    const auto c = piece.data.contiguous();
    putValue<int32_t>(out, static_cast<int32_t>(c.scalar_type()));
    putValue<int64_t>(out, c.numel());
    out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  }
  return out;
}

int64_t elasticElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && n > kMaxElements / d)) {
      SHOAL_THROW(InvalidArgument, "a tensor of shape [{}]: over 2^62 elements or negative",
                  fmt::join(shape, ", "));
    }
    n *= d;
  }
  return n;
}

// Checked before anything is allocated from it: a peer's bytes.
ElasticPart decodeElasticPart(std::string_view bytes, const std::string& what) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    SHOAL_THROW(InvalidArgument, "{}: not a Shoal elastic shard", what);
  }
  ByteReader r(bytes.substr(sizeof kMagic), what);
  ElasticPart part;
  part.progress.step = r.get<int64_t>();
  part.progress.epoch = r.get<int64_t>();
  part.progress.position = r.get<int64_t>();
  part.optimizerStep = r.get<int64_t>();
  const auto count = r.count(1, "pieces");
  for (uint64_t i = 0; i < count; ++i) {
    FlatPiece piece;
    piece.name = std::string(r.bytes());
    const auto dims = r.get<int32_t>();
    if (dims < 0 || dims > kMaxDims) SHOAL_THROW(InvalidArgument, "{}: {} dimensions", what, dims);
    for (int32_t d = 0; d < dims; ++d) piece.shape.push_back(r.get<int64_t>());
    int64_t total = 0;
    try {
      total = elasticElements(piece.shape);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "{}: '{}': {}", what, piece.name, e.what());
    }
    piece.offset = r.get<int64_t>();
    const auto type = static_cast<torch::ScalarType>(r.get<int32_t>());
    // Floating point for parameters and optimizer state; integers for buffers such as
    // BatchNorm's num_batches_tracked.
    if (type != torch::kFloat && type != torch::kDouble && type != torch::kHalf &&
        type != torch::kBFloat16 && type != torch::kLong && type != torch::kInt) {
      SHOAL_THROW(InvalidArgument, "{}: '{}' has element type {}", what, piece.name,
                  static_cast<int>(type));
    }
    const auto numel = r.get<int64_t>();
    if (numel < 0 || piece.offset < 0 || piece.offset > total - numel) {
      SHOAL_THROW(InvalidArgument, "{}: '{}' elements [{}, +{}) outside its {}", what, piece.name,
                  piece.offset, numel, total);
    }
    const auto elementSize = static_cast<uint64_t>(c10::elementSize(type));
    if (static_cast<uint64_t>(numel) > r.remaining() / elementSize) {
      SHOAL_THROW(InvalidArgument, "{}: '{}' is truncated", what, piece.name);
    }
    const auto data = r.take(static_cast<uint64_t>(numel) * elementSize);
    piece.data = torch::empty({numel}, torch::TensorOptions().dtype(type));
    std::memcpy(piece.data.data_ptr(), data.data(), data.size());
    part.pieces.push_back(std::move(piece));
  }
  if (!r.atEnd()) SHOAL_THROW(InvalidArgument, "{}: {} bytes after the end", what, r.remaining());
  return part;
}

}  // namespace shoal::train::zero
