// Note [Replacement servers] (ps/replacement.h), the server's side: a surviving copy handing its
// shard over to a replacement of the other copy, and a replacement taking it (ps/server_state.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/native/native_engine.h"
#include "common/error.h"
#include "common/log.h"
#include "ps/replacement.h"
#include "ps/server_state.h"
#include "ps/shard_restore.h"

namespace shoal::ps::detail {

namespace {

// Replacements counted in but never served are told so; at most this many (each one is a
// process that was started and is waiting).
constexpr int64_t kMaxUnserved = 64;

}  // namespace

Server::~Server() {
  if (handoverThread_.joinable()) handoverThread_.join();
}

Target Server::wholeShard() const {
  return {0, shard_->pieceCount(), 0, shard_->elements()};
}

std::string Server::pairNameFor(int w) const {
  const std::string usual = backup_ ? backupPairName(id_, w) : pairName(id_, w);
  return incarnation_ > 0 ? replacementPairName(usual, incarnation_) : usual;
}

void Server::maybePlanHandover(const Request& rq, const Target& t) {
  if (!sole_ || opt_.replicas != 2 || config_.mode != Mode::kSync) return;
  if (shard_->pieceCount() == 0 || t.first != 0 || t.last != shard_->pieceCount()) return;
  if (handoverStep_ != 0 && !handedOver_) return;  // one is planned already
  int64_t waiting = 0;
  try {
    waiting = comm::nativeEngine(world_).store().add(replacementKey(id_, !backup_), 0);
  } catch (const Error& e) {
    // Training goes on unreplicated; workers that are still alone say so with their next
    // request, which asks again.
    SHOAL_LOG_WARN("{}: could not look for a replacement of shard {}'s {}: {}", name_, id_,
                   copyName(!backup_), e.what());
    sole_ = false;
    return;
  }
  if (waiting <= handoverIncarnation_ || waiting >= kReplacementsClosed) return;
  if (handoverThread_.joinable()) handoverThread_.join();  // the previous one (bounded)
  handoverStep_ = rq.step + 1;
  handoverIncarnation_ = waiting;
  handedOver_ = false;
  if (!opt_.quiet) {
    fmt::print(
        "{}: replacement {} of shard {}'s {} is waiting; it takes the shard over at step {}\n",
        name_, waiting, id_, copyName(!backup_), handoverStep_);
    std::fflush(stdout);
  }
}

void Server::maybeHandOver() {
  if (handoverStep_ == 0 || handedOver_) return;
  if (minVersion(wholeShard()) < handoverStep_) return;
  handedOver_ = true;
  // Workers still without the other copy (their connection to the replacement failed) say so
  // again with their next request.
  sole_ = false;
  const std::vector<uint64_t> clocks(static_cast<size_t>(workers_), handoverStep_);
  auto snapshot = std::make_shared<const std::string>(
      shard_->snapshot(shardCheckpointHeader(configText_, id_, servers_, partition_->keysText()),
                       handoverStep_, clocks));
  const int64_t k = handoverIncarnation_;
  const uint64_t step = handoverStep_;
  // Sent outside the lock: the workers go on meanwhile (the replacement serves them only once
  // it has the snapshot, and their pushes of step `step` wait for that).
  handoverThread_ = std::thread([this, snapshot, k, step] {
    try {
      sendHandover(world_, id_, !backup_, k, *snapshot);
      if (!opt_.quiet) {
        fmt::print("{}: handed shard {} over to replacement {} of its {} at step {} ({} bytes)\n",
                   name_, id_, k, copyName(!backup_), step, snapshot->size());
        std::fflush(stdout);
      }
    } catch (const std::exception& e) {
      // The workers' connections to the replacement then fail, and they go on without it.
      SHOAL_LOG_WARN("{}: handing shard {} over to replacement {} failed: {}", name_, id_, k,
                     e.what());
    }
  });
}

uint64_t Server::pullFlags(uint64_t step) const {
  return handoverStep_ != 0 && step >= handoverStep_ ? replacementFlags(handoverIncarnation_) : 0;
}

bool Server::takeOver() {
  store::Store& store = comm::nativeEngine(world_, "a replacement parameter server").store();
  const int64_t k = store.add(replacementKey(id_, backup_), 1);
  if (k >= kReplacementsClosed) return false;
  incarnation_ = k;
  if (!opt_.quiet) {
    fmt::print("{}: replacement {} of shard {}'s {}: waiting for its surviving copy\n", name_, k,
               id_, copyName(backup_));
    std::fflush(stdout);
  }
  std::string snapshot;
  if (!receiveHandover(world_, id_, backup_, k, snapshot)) return false;
  auto r = restoreSnapshot(snapshot, id_, servers_, workers_,
                           fmt::format("the handover of shard {} to replacement {}", id_, k));
  std::lock_guard<std::mutex> lock(mu_);
  configText_ = std::move(r.configText);
  config_ = r.config;
  partition_ = std::move(r.partition);
  shard_ = std::move(r.shard);
  clocks_ = std::move(r.clocks);
  resumeStep_ = lastCheckpoint_ = report_.resumedFrom = r.round;
  report_.partition = partition_->describe();
  configured_ = initialized_ = restored_ = true;
  if (!opt_.quiet) {
    fmt::print("{}: replacement {} took shard {}'s {} over at step {}\n", name_, k, id_,
               copyName(backup_), r.round);
    std::fflush(stdout);
  }
  return true;
}

void Server::closeReplacements() {
  if (handoverThread_.joinable()) handoverThread_.join();
  if (opt_.replicas != 2) return;
  try {
    store::Store& store = comm::nativeEngine(world_).store();
    const int64_t counted =
        store.add(replacementKey(id_, !backup_), kReplacementsClosed) - kReplacementsClosed;
    const int64_t served = handedOver_ ? handoverIncarnation_ : 0;
    for (int64_t k = std::max(served + 1, counted - kMaxUnserved + 1); k <= counted; ++k) {
      store.set(handoverKey(id_, !backup_, k), kHandoverEnded);
    }
  } catch (const std::exception& e) {
    // A replacement still waiting is stopped with the job by its launcher.
    SHOAL_LOG_WARN("{}: could not close the replacements of shard {}'s {}: {}", name_, id_,
                   copyName(!backup_), e.what());
  }
}

}  // namespace shoal::ps::detail
