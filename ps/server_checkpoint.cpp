// A parameter server's checkpoints: when one is due, writing it, and restoring the shard from
// them at start (ps/server_state.h; the files: ps/shard_restore.h).
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "ps/server_state.h"
#include "ps/shard_restore.h"

namespace shoal::ps::detail {

uint64_t Server::checkpointRound() const {
  if (config_.mode == Mode::kSync && shard_->pieceCount() > 0) {
    return minVersion({0, shard_->pieceCount(), 0, shard_->elements()});
  }
  return minClock();
}

void Server::maybeCheckpoint(std::unique_lock<std::mutex>& lock) {
  if (!series_ || opt_.checkpointEvery <= 0) return;
  const auto every = static_cast<uint64_t>(opt_.checkpointEvery);
  auto due = [&] { return checkpointRound() / every > lastCheckpoint_ / every; };
  if (!due()) return;
  // An update being applied elsewhere would be half in the snapshot (Note [Shard access] in
  // ps/shard_access.h).
  waitUntil(
      lock, [&] { return !access_.writerActive(); },
      [] { return std::string("a checkpoint waited for an update to finish"); });
  if (due()) writeCheckpoint(checkpointRound());
}

void Server::writeCheckpoint(uint64_t round) {
  // Every worker resumes from `round`: in synchronous mode the contributions already pushed
  // for the next step are not saved (they are pushed again).
  std::vector<uint64_t> clocks(static_cast<size_t>(workers_), round);
  // Note [Resharding checkpoints]: the writer and its job's server count, before the keys.
  const std::string header =
      shardCheckpointHeader(configText_, id_, servers_, partition_->keysText());
  try {
    report_.lastCheckpoint =
        series_->write(static_cast<int64_t>(round), shard_->snapshot(header, round, clocks));
  } catch (const std::exception& e) {
    throw CheckpointWriteError(fmt::format(
        "parameter server {}: writing the checkpoint of step {} failed: {}", id_, round, e.what()));
  }
  lastCheckpoint_ = round;
}

// Note [Resharding checkpoints] in ps/shard_restore.cpp. A failure throws InvalidArgument on
// the servers that read the file; the job fails as on any other server error.
void Server::restore() {
  auto group = world_.connect("ps-servers", id_, servers_);
  auto r = restoreShard(*group, workers_, opt_.checkpointDir, opt_.keep);
  if (!r) return;  // a fresh job
  configText_ = std::move(r->configText);
  config_ = r->config;
  partition_ = std::move(r->partition);
  shard_ = std::move(r->shard);
  clocks_ = std::move(r->clocks);
  resumeStep_ = lastCheckpoint_ = report_.resumedFrom = r->round;
  report_.partition = partition_->describe();
  configured_ = initialized_ = restored_ = true;
  if (!opt_.quiet) {
    fmt::print("parameter server {} of {}: resumed from {} (step {})\n", id_, servers_, r->from,
               r->round);
    std::fflush(stdout);
  }
}

}  // namespace shoal::ps::detail
