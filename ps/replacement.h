// Replacement parameter servers: a lost server started again takes its shard copies back from
// the copies that survived (internal to ps/: the server's and the client's sides share these
// names and flags; tests read replacementKey to wait for a replacement).
//
// Note [Replacement servers]
// With replicas 2 (Note [Replicated shards] in ps/server.h) a lost server can be started again
// in its place (shoal run --ps-replacements N, ServerOptions::replacement). The new process
// cannot form the world group again with the running ranks: it attaches to the world's store
// keys (comm/native/native_engine.h's attachToWorld) and takes back each of its two copies
// (shard s's primary, shard s - 1's backup) from the copy of that shard that survived:
//  1. The replacement counts itself in: adding 1 to replacementKey(shard, backup) gives its
//     incarnation k. A count at or above kReplacementsClosed means the surviving copy already
//     served its last worker: there is nothing left to take over.
//  2. The surviving copy learns that it is alone from the workers: a worker that lost the other
//     copy of a shard marks its requests to this one kSoleCopy (Request::flags). From then
//     on, in synchronous mode, the push that completes a step of the whole shard (step T - 1,
//     before any pull of step T can be answered) reads the count (one store round trip per
//     step); when a replacement waits, step T becomes the handover: every pull reply for step T
//     or later carries kReplacementReady with k (Reply::flags), and as soon as step T - 1 is
//     applied the shard is snapshotted (values, optimizer state, versions: Shard::snapshot)
//     and sent to the replacement over the pair group handoverName(...), from a thread of its
//     own, after handoverKey(...) was set to kHandoverReady.
//  3. The replacement restores the snapshot and serves the workers over new pair groups
//     (replacementPairName of the usual names). A worker that sees the flag connects to it and
//     says hello before its next request to that shard, which is its push of step T: from then
//     on both copies apply every push again, so in synchronous mode they stay bit-identical.
//  4. A surviving copy whose workers are all done closes the count (adds kReplacementsClosed)
//     and sets handoverKey(...) to kHandoverEnded for a replacement that counted itself in and
//     was not served; one that comes later sees the closed count. Either returns at once.
// Limits: synchronous mode only (the asynchronous modes have no moment at which no worker has a
// push in flight: a replacement there waits until the job ends and serves nothing); a shard
// pushed only key by key never has a whole-shard step boundary, and is not handed over; a
// worker that already said goodbye is not served by the replacement.
#pragma once

#include <cstdint>
#include <string>

#include "comm/group.h"

namespace shoal::ps {

// Request::flags: the worker holds no other copy of this shard (it lost the other one).
inline constexpr uint32_t kSoleCopy = 1;
// Reply::flags of a pull: the shard's lost copy is back, as the replacement whose incarnation
// is in the upper 32 bits.
inline constexpr uint64_t kReplacementReady = 2;
// Added to a replacement count when the surviving copy is done.
inline constexpr int64_t kReplacementsClosed = int64_t{1} << 30;
// A handover's size is checked against this before anything is allocated (the snapshot's own
// header is then checked against the shard it describes: Shard::checkSnapshotFits).
inline constexpr uint64_t kMaxHandoverBytes = uint64_t{1} << 40;

inline constexpr const char* kHandoverReady = "ready";
inline constexpr const char* kHandoverEnded = "ended";

// "primary" or "backup": a shard copy's name in keys, group names and messages.
const char* copyName(bool backup);

// The store counter of the replacements of shard `shard`'s primary (backup false) or backup,
// in the world group's store (NativeEngine::store()).
std::string replacementKey(int shard, bool backup);
// Set by the surviving copy when replacement `incarnation` may connect (kHandoverReady) or
// will never be served (kHandoverEnded).
std::string handoverKey(int shard, bool backup, int64_t incarnation);
// The pair group over which the snapshot travels (surviving copy rank 0, replacement rank 1).
std::string handoverName(int shard, bool backup, int64_t incarnation);
// The pair group between a replacement and a worker: `pair` is the copy's usual pair name
// (pairName / backupPairName in ps/protocol.h).
std::string replacementPairName(const std::string& pair, int64_t incarnation);

// The flags of a pull reply announcing replacement `incarnation`, and the incarnation a reply
// announces (0: none).
uint64_t replacementFlags(int64_t incarnation);
int64_t announcedReplacement(uint64_t replyFlags);

// The surviving copy's side: sends `snapshot` over handoverName(...) (blocking, bounded by the
// world's timeout: the connection, then the transfer). Throws what failed.
void sendHandover(comm::Group& world, int shard, bool backup, int64_t incarnation,
                  const std::string& snapshot);
// The replacement's side: waits until the surviving copy hands the copy over (returns the
// snapshot) or says the job ended (returns false). Waits as long as the job runs, checking for
// the end every world timeout; a job that fails is stopped by its launcher. Throws StoreError,
// TimeoutError / PeerError (the transfer), ProtocolError (a size over kMaxHandoverBytes).
bool receiveHandover(comm::Group& world, int shard, bool backup, int64_t incarnation,
                     std::string& snapshot);

}  // namespace shoal::ps
