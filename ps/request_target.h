// What a parameter-server request (ps/protocol.h) covers of one server's shard: one key's
// piece, or every piece (kAllKeys), checked against the model the workers described. A pure
// function of the request, the partition and the shard: the server calls it under its lock
// (ps/server_state.h) and the fuzz target ps_request on crafted requests.
#pragma once

#include <cstddef>
#include <span>

#include "ps/partition.h"
#include "ps/protocol.h"
#include "ps/shard.h"

namespace shoal::ps {

// The pieces [first, last) of a shard a request covers, and their place in it.
struct Target {
  size_t first = 0, last = 0;
  size_t offset = 0;  // local element offset
  size_t count = 0;   // elements
};

// `shard` is server `server`'s shard of `partition`. InvalidArgument (one line) for a key the
// model does not have, a dtype or shape other than the key's, a key this server holds no piece
// of, or a whole-shard request in a dtype other than float32.
Target requestTarget(const Request& rq, const Partition& partition, const Shard& shard, int server);

// The pieces t covers, from the partition's list of the server's pieces.
std::span<const Piece> targetPieces(const Partition& partition, int server, const Target& t);

}  // namespace shoal::ps
