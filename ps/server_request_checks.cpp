// Whether a request may ask what it asks of a parameter server (ps/server_state.h); what it
// covers of the shard is ps/request_target.h's.
#include <span>

#include "common/error.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

Target Server::target(const Request& rq) const {
  return requestTarget(rq, *partition_, *shard_, id_);
}

void Server::expectBytes(uint64_t got, uint64_t expected, const char* what) {
  if (got != expected) {
    SHOAL_THROW(InvalidArgument, "{} carries {} bytes, expected {}", what, got, expected);
  }
}

std::span<const Piece> Server::piecesOf(const Target& t) const {
  return targetPieces(*partition_, id_, t);
}

void Server::requireConfigured() const {
  if (!configured_) SHOAL_THROW(InvalidArgument, "request before the worker's hello");
}

}  // namespace shoal::ps::detail
