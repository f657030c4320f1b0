// The parameter servers on the timeline (common/trace.h, README "Timeline"): the spans a worker
// records for its calls and a server for the updates it applies, category "ps". They go to the
// world group's sink (GroupOptions::trace; SHOAL_TRACE makes one); with none, nothing is built
// and each call pays a branch.
//
// Worker ("push", "pull", "push-pull"): one asynchronous span per call of ps::Client (calls
// overlap: each is drawn on a track of its own), from the call until its Work finishes, with
//   worker, step   the worker, and the step the call carries
//   key            one-key calls only: the key's name
//   shards         the exchanges it made (one per shard it reached)
//   bytes          pushes: the payload sent, as encoded; encoding, where not raw
//   pulled_bytes   pulls: the values received, as encoded
//   version        pulls: the fewest updates any of those shards had applied to the values
//   lead           pulls: how many steps the worker was ahead of the slowest worker when the
//                  values were released (its staleness, which SSP bounds)
//   error          only if it failed: the error's first line
// Hello, init and goodbye are not recorded (the pair groups' own "comm" spans show them).
//
// Server ("apply"): one span per update applied to the shard, on the thread serving the worker
// whose push it applies: from when the push began to arrive (an update applied as it arrives,
// out of the receive ring: receiving and applying overlap) or from when a synchronous step's
// contributions are reduced out of the workers' slots, until the versions moved on. With
//   worker, step   the pushing worker (in synchronous mode the one completing the step) and its
//                  step
//   key            one-key pushes only: the key's name
//   elements       the float32 elements updated
//   version        the fewest updates applied to those elements, counting this one
//   contributions  the workers' gradients in it (synchronous: every worker's, averaged; else 1)
//   lead           the pushing worker's step minus the slowest worker's clock (steps pushed):
//                  how stale the others are relative to this update
//   from           "arrival" (applied as it arrived) or "slots" (reduced from the slots)
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/trace.h"
#include "ps/protocol.h"

namespace shoal::ps {

// A worker's call of `kind`, begun now; nullopt without a sink. `key`: one-key calls only.
std::optional<TraceSpan> beginCallSpan(TraceSink* sink, RequestKind kind, int worker, int64_t step,
                                       const std::string* key);
// Ends and records `span` with what the exchanges `xs` carried and the call's outcome. Never
// throws (a span that cannot be built is lost, not the call).
void endCallSpan(TraceSink& sink, TraceSpan span, RequestKind kind,
                 const std::vector<std::shared_ptr<Exchange>>& xs,
                 std::exception_ptr error) noexcept;

// An update of a server's shard, begun now; nullopt without a sink.
std::optional<TraceSpan> beginApplySpan(TraceSink* sink);

struct AppliedUpdate {
  int worker = 0;
  uint64_t step = 0;
  const std::string* key = nullptr;  // one-key pushes only
  size_t elements = 0;
  uint64_t version = 0;
  int contributions = 1;
  int64_t lead = 0;
  bool fromSlots = false;
};
// Ends and records an update's span. Never throws.
void endApplySpan(TraceSink& sink, TraceSpan span, const AppliedUpdate& update) noexcept;

}  // namespace shoal::ps
