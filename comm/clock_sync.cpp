#include "comm/clock_sync.h"

#include <chrono>
#include <limits>

#include "comm/collectives.h"
#include "common/error.h"

namespace shoal::comm {

namespace {

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ClockOffset measureClockOffset(Group& g, const ClockSyncOptions& options) {
  if (options.rounds < 1 || options.rounds > 1000) {
    SHOAL_THROW(InvalidArgument, "rank {}: clock sync: rounds {}: expected 1 to 1000", g.rank(),
                options.rounds);
  }
  const std::function<int64_t()> now = options.clock ? options.clock : steadyNs;
  if (g.rank() == 0) {
    for (int peer = 1; peer < g.size(); ++peer) {
      for (int round = 0; round < options.rounds; ++round) {
        int64_t ping = 0;
        recv(g, &ping, 1, DataType::kInt64, peer, options.call);
        // The answer carries the round back, so a ping and answer that crossed wrongly are
        // caught on the peer instead of producing a plausible offset.
        int64_t answer[3] = {now(), 0, ping};
        answer[1] = now();
        send(g, answer, 3, DataType::kInt64, peer, options.call);
      }
    }
    return {.atNs = now()};
  }
  int64_t bestTrip = std::numeric_limits<int64_t>::max();
  ClockOffset best;
  for (int round = 0; round < options.rounds; ++round) {
    const int64_t ping = round;
    const int64_t t0 = now();
    send(g, &ping, 1, DataType::kInt64, 0, options.call);
    int64_t answer[3] = {};
    recv(g, answer, 3, DataType::kInt64, 0, options.call);
    const int64_t t3 = now();
    if (answer[2] != round) {
      SHOAL_THROW(ProtocolError, "rank {}: clock sync: rank 0 answered round {} with round {}",
                  g.rank(), round, answer[2]);
    }
    const int64_t t1 = answer[0], t2 = answer[1];
    // Rank 0's time between ping and answer is not part of the trip; a negative trip can only
    // come from a clock that went backwards, and is skipped.
    const int64_t trip = (t3 - t0) - (t2 - t1);
    if (trip < 0 || trip >= bestTrip) continue;
    bestTrip = trip;
    best.offsetNs = ((t1 - t0) + (t2 - t3)) / 2;
    best.atNs = t0 + (t3 - t0) / 2;
    // Rounded up: the bound must not claim more precision than the trip allows.
    best.errorNs = (trip + 1) / 2;
  }
  if (bestTrip == std::numeric_limits<int64_t>::max()) {
    SHOAL_THROW(InternalError, "rank {}: clock sync: no round had a valid round trip", g.rank());
  }
  return best;
}

}  // namespace shoal::comm
