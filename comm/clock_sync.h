// How far each rank's clock is from rank 0's, measured over the group: what puts the timelines
// of ranks on different hosts on one time axis (common/trace_file.h, README "Timeline").
//
// Protocol (NTP's, per peer): rank 0 serves the other ranks one after another. In each of
// `rounds` rounds, rank p reads its clock (t0) and sends a ping to rank 0; rank 0 reads its
// clock when the ping arrived (t1) and just before it answers (t2), and sends both back; rank
// p reads its clock when the answer arrived (t3). Then
//   round trip  d = (t3 - t0) - (t2 - t1)
//   offset      o = ((t1 - t0) + (t2 - t3)) / 2      (rank 0's clock ~ rank p's clock + o)
// and since the answer cannot arrive before it was sent nor the ping before it left, the true
// offset lies within o ± d/2 whatever the asymmetry of the two paths. The round with the
// smallest d wins (the one least delayed by scheduling or queueing); its d/2 is the error bound.
// Messages: 2 x rounds point-to-point messages of 8 and 24 bytes per peer.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/group.h"

namespace shoal::comm {

struct ClockOffset {
  int64_t offsetNs = 0;  // add to this rank's clock to read rank 0's
  int64_t errorNs = 0;   // the true offset is within offsetNs ± errorNs
  // When it held, on this rank's clock: halfway through the round that was kept. Clocks drift
  // apart, so an offset is only as good as its age (run/trace_session.h measures again).
  int64_t atNs = 0;
};

struct ClockSyncOptions {
  int rounds = 16;  // per peer, in [1, 1000]
  // The clock to align (nanoseconds). Null: the steady clock. A TraceSink's now() when the
  // offset is for that sink's spans.
  std::function<int64_t()> clock;
  CallOptions call;  // each message's timeout (default: the group's)
};

// Collective over `g`: every rank calls it; returns this rank's offset against g's rank 0
// ({0, 0, now} on rank 0). Blocking; its messages are point-to-point (tag 0) and so must not be
// interleaved with other point-to-point traffic of the caller on `g` (collectives of other
// threads are fine). Throws what send / recv throw (TimeoutError, PeerError, MismatchError),
// InvalidArgument for rounds out of range, ProtocolError for an answer that does not match its
// ping, InternalError if the clock ran backwards in every round.
ClockOffset measureClockOffset(Group& g, const ClockSyncOptions& options = {});

}  // namespace shoal::comm
