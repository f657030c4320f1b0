// Push-pulls answered while their push is applied (ps/server_state.h).
#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

// ---- Note [Streamed push-pull]
//
// A push-pull whose push is applied as it arrives (Note [Update from the ring]) and whose pull
// could then be answered at once (synchronous: the push completes the step; asynchronous;
// SSP within the bound) does not wait for the whole payload before replying: the reply
// header goes first, decided now, and each piece of the values follows as soon as the same
// piece of the push was applied (transport::Transfer::sendAsReady), so the update and the
// reply overlap, and so do the worker's copy of the gradients into the ring and its copy of
// the values out. The write hold covers the whole exchange, so the values sent are exactly
// those after this push, as pull() would send them. The reply's numbers are those pull()
// would give right after push(); a worker saying goodbye meanwhile can make `slowest`
// one step older than that. A failure of the server after the header went out reaches the
// worker with its next request.

void Server::maybeStream(int w, const Request& rq, const Target& t, Scratch& sc) {
  if (t.count == 0 || rq.pullBytes != t.count * sizeof(float)) return;  // pull() refuses
  // Only a raw push arrives piece by piece, and only raw values go out as they are updated.
  if (rq.encoding != 0 || rq.pullEncoding != 0) return;
  const uint64_t step = rq.step + 1;
  const uint64_t slowest = minClock(w, step);
  if (config_.mode == Mode::kSsp && slowest + static_cast<uint64_t>(config_.staleness) < step) {
    return;  // the pull must wait for slower workers
  }
  sc.reply = Reply{};
  sc.reply.step = step;
  sc.reply.slowest = slowest;
  sc.reply.version = minVersion(t) + 1;  // every piece of t moves on with this push
  sc.reply.bytes = t.count * sizeof(float);
  sc.reply.flags = pullFlags(step);
  sc.values = shard_->values() + t.offset;
  sc.streaming = true;
}

void Server::completeStreamed(int w, const Request& rq, Scratch& sc) {
  std::unique_lock<std::mutex> lock(mu_);
  throwIfFailed();
  try {
    push(lock, w, rq, sc);
  } catch (const ServerFault&) {
    throw;
  } catch (const Error& e) {
    // The worker already has its reply: what went wrong here is the server's to report.
    throw ServerFault(
        fmt::format("{}: after worker {}'s push-pull of step {}: {}", name_, w, rq.step, e.what()));
  }
  ++report_.pulls;
  ++report_.streamed;
  report_.maxLead = std::max<int64_t>(report_.maxLead, static_cast<int64_t>(sc.reply.step) -
                                                           static_cast<int64_t>(sc.reply.slowest));
}

}  // namespace shoal::ps::detail
