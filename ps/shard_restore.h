// Where the parameter servers' checkpoints live and how a job resumes from them, with the same
// or another number of servers (Note [Resharding checkpoints] in ps/shard_restore.cpp).
//
// Layout: server s writes its shard of step T to <dir>/server-<s>/shard-<T>.bin (a sealed file,
// common/sealed_file.h); the snapshot's header (Shard::snapshot) is the settings line, then
// "#servers s N" (the writer and its job's server count), then the model's keys.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/shard.h"

namespace shoal::ps {

// Server `server`'s folder: <dir>/server-<server>.
std::string shardCheckpointFolder(const std::string& dir, int server);

// The header text of server `server`'s snapshot in a job of `servers` servers.
std::string shardCheckpointHeader(const std::string& configText, int server, int servers,
                                  const std::string& keysText);

// A job's shards as the checkpoints of step `round` left them, rebuilt for this server.
struct RestoredShard {
  std::string configText;  // the settings line, as the workers' hellos must match it
  TrainingConfig config;
  std::unique_ptr<Partition> partition;  // this job's partition of the checkpoint's keys
  std::unique_ptr<Shard> shard;
  uint64_t round = 0;            // the step every worker resumes from
  std::vector<uint64_t> clocks;  // each worker's clock: `round`
  std::string from;              // what was read, for the log line
};

// Restores this server's shard from the newest step every server of the job that wrote the
// checkpoints has, resharding when that job ran another number of servers. `servers`: a group
// of this job's servers, rank = server id (collective: every server calls it once, at start).
// Returns nullopt when no server has a checkpoint (a fresh job). Errors: InvalidArgument naming
// the file and the server that wrote it, for a missing, corrupt or mismatched checkpoint, on
// every server that needs it (a shard missing everywhere but on some server, too).
// Blocking: one all-gather on `servers` (its timeout), then file reads.
std::optional<RestoredShard> restoreShard(comm::Group& servers, int workers, const std::string& dir,
                                          int keep);

// Shard `server` of `servers` from one snapshot of it (a replacement's handover: Note
// [Replacement servers] in ps/replacement.h): the header's settings and keys, the values,
// optimizer state and versions. Checked as a checkpoint file is (InvalidArgument naming
// `source`); clocks are every worker's at the snapshot's round.
RestoredShard restoreSnapshot(const std::string& payload, int server, int servers, int workers,
                              const std::string& source);

}  // namespace shoal::ps
