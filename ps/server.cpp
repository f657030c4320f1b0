// serve() and the life of one served shard: its restore, one thread per worker, its final
// checkpoint (the members: ps/server_state.h).
#include "ps/server.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "ps/server_state.h"
#include "ps/shard_restore.h"

namespace shoal::ps {

namespace detail {

Server::Server(comm::Group& world, int id, int servers, int workers, const ServerOptions& o,
               bool backup)
    : world_(world),
      id_(id),
      servers_(servers),
      workers_(workers),
      opt_(o),
      backup_(backup),
      sink_(world.options().trace.get()),
      name_(backup ? fmt::format("parameter server {} (backup of shard {})", (id + 1) % servers, id)
                   : fmt::format("parameter server {}", id)),
      clocks_(static_cast<size_t>(workers), 0),
      done_(static_cast<size_t>(workers), 0),
      busy_(static_cast<size_t>(workers), 0),
      pairs_(static_cast<size_t>(workers)) {
  SHOAL_CHECK(servers >= 1 && id >= 0 && id < servers, "server {} of {}", id, servers);
  SHOAL_CHECK(workers >= 1, "parameter server {}: {} workers", id, workers);
  if (!opt_.checkpointDir.empty() && !backup_) {
    series_ = std::make_unique<SealedSeries>(shardCheckpointFolder(opt_.checkpointDir, id),
                                             "shard-", ".bin", opt_.keep);
  }
}

ServerReport Server::run() {
  if (opt_.replacement) {
    // Note [Replacement servers]: the shard comes from its surviving copy, or not at all.
    if (!takeOver()) {
      report_.replacedNothing = true;
      return report_;
    }
  } else if (opt_.resume && series_) {
    restore();
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < workers_; ++w) threads.emplace_back([this, w] { serveWorker(w); });
  for (auto& t : threads) t.join();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.empty()) throw PeerError(failure_);
    report_.finalStep = minClock();
    if (series_ && configured_) writeCheckpoint(checkpointRound());
  }
  closeReplacements();
  return report_;
}

}  // namespace detail

ServerReport serve(comm::Group& world, int server, int numServers, int numWorkers,
                   const ServerOptions& options) {
  using detail::Server;
  if (options.replicas != 1 && options.replicas != 2) {
    SHOAL_THROW(InvalidArgument, "parameter-server replicas {}: 1 or 2", options.replicas);
  }
  if (options.replicas == 1) {
    if (options.replacement) {
      SHOAL_THROW(InvalidArgument,
                  "parameter server {}: a replacement needs replicas 2 (shoal run --ps-replicas "
                  "2): without a second copy there is nothing to take over from",
                  server);
    }
    return Server(world, server, numServers, numWorkers, options).run();
  }
  if (numServers < 2) {
    SHOAL_THROW(InvalidArgument,
                "parameter-server replicas 2 need at least 2 servers (the job has {})", numServers);
  }
  if (options.replacement && options.resume) {
    SHOAL_THROW(InvalidArgument,
                "parameter server {}: a replacement takes its shards from the surviving copies, "
                "not from checkpoints (resume is for a whole job started again)",
                server);
  }
  if (options.resume) {
    SHOAL_THROW(InvalidArgument,
                "parameter server {}: resuming from checkpoints with replicas 2 is not supported "
                "(resume with one copy of each shard: shoal run without --ps-replicas)",
                server);
  }
  // Note [Replicated shards]: this server's own shard, and the backup of the previous one.
  const int shard = (server + numServers - 1) % numServers;
  ServerReport backup;
  std::exception_ptr backupError;
  std::thread backupThread([&] {
    try {
      backup = Server(world, shard, numServers, numWorkers, options, /*backup=*/true).run();
    } catch (...) {
      backupError = std::current_exception();
    }
  });
  ServerReport primary;
  std::exception_ptr primaryError;
  try {
    primary = Server(world, server, numServers, numWorkers, options).run();
  } catch (...) {
    primaryError = std::current_exception();
  }
  // A failed primary's workers went on with its backup elsewhere: the backup hosted here still
  // serves its workers to the end.
  backupThread.join();
  if (primaryError) std::rethrow_exception(primaryError);
  if (backupError) std::rethrow_exception(backupError);
  primary.backups.push_back(std::move(backup));
  return primary;
}

}  // namespace shoal::ps
