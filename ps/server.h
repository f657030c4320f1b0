// A parameter server: holds one shard of the model and applies the workers' updates to it.
//
// serve() is what a server rank runs (shoal run --servers K gives K of them; see run/init.h for
// the roles). It learns the model and the training settings from the workers' hellos (all must
// agree), prints the partition, then serves every worker on its own thread over a two-rank
// group (ps/protocol.h), until every worker said goodbye.
//
// Failure: a worker that dies or breaks the protocol stops the server: workers waiting on it get
// PeerError naming the failed worker, idle connections are closed, and serve() throws. A request
// that is merely wrong (shape, dtype, key, step) is refused to that worker only.
// Timeouts: waiting for other workers (a synchronous step, the staleness bound) is bounded by
// the world group's timeout; waiting for a worker's next request by ServerOptions::idleTimeout.
// Tracing: with the world's trace sink (SHOAL_TRACE), each update applied to the shard records an
// "apply" span (ps/trace_spans.h).
// Threading: one thread per worker. A raw push is applied to the shard as it arrives, straight
// from the transport's receive ring (a compressed one is received whole, checked and decoded to
// float32 first: ps/payload_codec.h), and raw pull replies are sent straight from the shard's
// values (fp16 ones are encoded from them while the values are held still); one update or any
// number of replies at a time (Note [Shard access] in ps/shard_access.h), so while a push is
// being received other workers' updates and pulls wait for it (bounded like the rest).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::ps {

struct ServerOptions {
  // Shard checkpoints go to <checkpointDir>/server-<s>/ (sealed files, common/sealed_file.h);
  // empty: none.
  std::string checkpointDir;
  // Every this many steps of the slowest worker (0: only when training ends).
  int64_t checkpointEvery = 0;
  int keep = 2;
  // Restore the newest step every server has a checkpoint for (none anywhere: start fresh).
  // The job may run another number of servers than the one that wrote the checkpoints: the
  // shards are then rebuilt for the new partition from the old servers' files, which every
  // server must be able to read (a shared checkpointDir); folders of servers the writing job
  // did not run are ignored (Note [Resharding checkpoints] in ps/shard_restore.cpp). Exact in
  // synchronous mode. A missing or corrupt file throws InvalidArgument naming it and the server
  // that wrote it, on every server that needs it; the same number of workers is required.
  bool resume = false;
  std::chrono::nanoseconds idleTimeout = std::chrono::minutes(30);
  // Copies of each shard: 1, or 2 (Note [Replicated shards] below; the workers' ClientOptions
  // must say the same; shoal run --ps-replicas). Needs at least 2 servers; with 2, resume is
  // refused (InvalidArgument) and only the primaries write checkpoints.
  int replicas = 1;
  // This server was started in a lost server's place (World::psReplacement): instead of
  // waiting for the workers' hellos it takes each of its shard copies from the surviving copy
  // at the next step boundary, and the workers then use it again (Note [Replacement servers]
  // in ps/replacement.h). Needs replicas 2 and synchronous mode; if the job ends first, serve()
  // returns a report with `replacedNothing` set.
  bool replacement = false;
  bool quiet = false;  // do not print the partition
};

struct ServerReport {
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t refused = 0;
  uint64_t appliedOnArrival = 0;  // pushes applied as they arrived (Note [Update from the ring])
  uint64_t streamed = 0;          // push-pulls answered while applied (Note [Streamed push-pull])
  uint64_t resumedFrom = 0;       // the step this run started at
  uint64_t finalStep = 0;         // the slowest worker's step at the end
  int64_t maxLead = 0;            // the furthest any pull ran ahead of the slowest worker
  std::string partition;          // Partition::describe()
  std::string lastCheckpoint;
  // A replacement (ServerOptions::replacement) whose job ended before a surviving copy handed
  // this shard over: it served nothing.
  bool replacedNothing = false;
  // Replicas 2: the report of the backup this server hosted (one element).
  std::vector<ServerReport> backups;
};

// Note [Replicated shards]: with replicas 2, server s serves the primary of shard s and the
// backup of shard (s - 1) mod servers, each over its own connections to every worker (pair
// groups ps-s<s>-w<w> and ps-b<shard>-w<w>), on its own threads. The workers send every push
// to both copies and complete it once both applied it (ps/client.h), so the two copies apply
// the same updates under the same rules: bit-identical in synchronous mode (each step reduced
// in worker order); the same updates, possibly in another order, in the asynchronous modes.
// When a server is lost the workers go on with the backups of its shard; a job loses data only
// when both copies of a shard are lost (servers s and s + 1). The cost: every push crosses the
// network twice (the worker sends it to both), pulls once.
//
// A lost server can be started again in its place (ServerOptions::replacement): it takes both
// copies back from the ones that survived, while the job runs (Note [Replacement servers] in
// ps/replacement.h).
//
// serve() returns once both the primary and the backup are done; when the primary failed
// (its workers went on with its backup elsewhere), the backup hosted here still serves to the
// end, then the primary's error is thrown. Shoal run --ps-replicas 2 keeps the job going when a
// server rank fails.
//
// `world` is the job's world group (native engine); this is server `server` of `numServers`,
// serving workers 0..numWorkers-1.
ServerReport serve(comm::Group& world, int server, int numServers, int numWorkers,
                   const ServerOptions& options = {});

}  // namespace shoal::ps
