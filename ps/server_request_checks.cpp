// What a request covers of a parameter server's shard, and whether it may ask for it
// (ps/server_state.h).
#include <algorithm>
#include <span>
#include <vector>

#include "common/error.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

Target Server::target(const Request& rq) const {
  Target t;
  if (rq.key == kAllKeys) {
    if (rq.dtype != static_cast<uint8_t>(DataType::kFloat32)) {
      SHOAL_THROW(InvalidArgument, "the whole shard is float32, not {}",
                  toString(static_cast<DataType>(rq.dtype)));
    }
    t.first = 0;
    t.last = shard_->pieceCount();
    t.count = shard_->elements();
    return t;
  }
  const auto& keys = partition_->keys();
  if (rq.key < 0 || static_cast<size_t>(rq.key) >= keys.size()) {
    SHOAL_THROW(InvalidArgument, "no key {} (the model has {})", rq.key, keys.size());
  }
  const KeySpec& k = keys[rq.key];
  std::vector<int64_t> shape(rq.shape, rq.shape + std::min<int>(rq.ndim, kMaxDims));
  if (rq.dtype != static_cast<uint8_t>(k.dtype) || shape != k.shape) {
    SHOAL_THROW(InvalidArgument, "key '{}' is {}; got {}", k.name, describeTensor(k.dtype, k.shape),
                describeTensor(static_cast<DataType>(rq.dtype), shape));
  }
  for (size_t i = 0; i < shard_->pieceCount(); ++i) {
    if (shard_->piece(i).key == rq.key) {
      t.first = i;
      t.last = i + 1;
      t.offset = shard_->localOffset(i);
      t.count = shard_->piece(i).count;
      return t;
    }
  }
  SHOAL_THROW(InvalidArgument, "key '{}' is not held by server {}", k.name, id_);
}

void Server::expectBytes(uint64_t got, uint64_t expected, const char* what) {
  if (got != expected) {
    SHOAL_THROW(InvalidArgument, "{} carries {} bytes, expected {}", what, got, expected);
  }
}

std::span<const Piece> Server::piecesOf(const Target& t) const {
  return std::span(partition_->pieces(id_)).subspan(t.first, t.last - t.first);
}

void Server::requireConfigured() const {
  if (!configured_) SHOAL_THROW(InvalidArgument, "request before the worker's hello");
}

}  // namespace shoal::ps::detail
