// What a request covers of a parameter server's shard (ps/request_target.h).
#include "ps/request_target.h"

#include <algorithm>
#include <vector>

#include "common/error.h"

namespace shoal::ps {

Target requestTarget(const Request& rq, const Partition& partition, const Shard& shard,
                     int server) {
  Target t;
  if (rq.key == kAllKeys) {
    if (rq.dtype != static_cast<uint8_t>(DataType::kFloat32)) {
      SHOAL_THROW(InvalidArgument, "the whole shard is float32, not {}",
                  toString(static_cast<DataType>(rq.dtype)));
    }
    t.first = 0;
    t.last = shard.pieceCount();
    t.count = shard.elements();
    return t;
  }
  const auto& keys = partition.keys();
  if (rq.key < 0 || static_cast<size_t>(rq.key) >= keys.size()) {
    SHOAL_THROW(InvalidArgument, "no key {} (the model has {})", rq.key, keys.size());
  }
  const KeySpec& k = keys[rq.key];
  std::vector<int64_t> shape(rq.shape, rq.shape + std::min<int>(rq.ndim, kMaxDims));
  if (rq.dtype != static_cast<uint8_t>(k.dtype) || shape != k.shape) {
    SHOAL_THROW(InvalidArgument, "key '{}' is {}; got {}", k.name, describeTensor(k.dtype, k.shape),
                describeTensor(static_cast<DataType>(rq.dtype), shape));
  }
  for (size_t i = 0; i < shard.pieceCount(); ++i) {
    if (shard.piece(i).key == rq.key) {
      t.first = i;
      t.last = i + 1;
      t.offset = shard.localOffset(i);
      t.count = shard.piece(i).count;
      return t;
    }
  }
  SHOAL_THROW(InvalidArgument, "key '{}' is not held by server {}", k.name, server);
}

std::span<const Piece> targetPieces(const Partition& partition, int server, const Target& t) {
  return std::span(partition.pieces(server)).subspan(t.first, t.last - t.first);
}

}  // namespace shoal::ps
