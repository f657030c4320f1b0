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
  // did not run are ignored (Note [Resharding checkpoints] in ps/server.cpp). Exact in
  // synchronous mode. A missing or corrupt file throws InvalidArgument naming it and the server
  // that wrote it, on every server that needs it; the same number of workers is required.
  bool resume = false;
  std::chrono::nanoseconds idleTimeout = std::chrono::minutes(30);
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
};

// `world` is the job's world group (native engine); this is server `server` of `numServers`,
// serving workers 0..numWorkers-1.
ServerReport serve(comm::Group& world, int server, int numServers, int numWorkers,
                   const ServerOptions& options = {});

}  // namespace shoal::ps
