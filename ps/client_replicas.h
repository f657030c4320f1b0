// Internal to ps/client.cpp: the worker's side of replicated shards (Client::Replicas), which
// copy of each shard a request goes to, what a lost copy means, and a lost copy's return.
//
// Note [Replicated shards], the worker's side (the servers' side is in ps/server.h). Shard s
// has its primary on server s and its backup on server (s + 1) % servers. Every request but a
// pull goes to both (a push-pull's copy to the backup is a plain push); the call completes
// once both answered, so an acknowledged update is held by two servers. Both apply the same
// pushes under the same rules, so in synchronous mode they hold bit-identical values; in the
// asynchronous modes they apply the same updates, possibly in another order.
//
// A replica is lost when its exchange fails without an answer from its server (the
// connection broke, or no reply came within the timeout) or with the server saying it failed
// (if a worker died, the other copy fails the same way and the call fails); another answered
// failure (a refusal, a server that gave up waiting for a slow worker) is the call's error and
// loses nothing, unless only one of the two answered that way: then the backup no longer
// mirrors the primary and is dropped. A lost replica's link is interrupted (its server sees this
// worker leave) and never used again; a lost primary's pull is repeated on the backup, after this
// call's push there.
//
// A lost copy comes back when a replacement server took it over (Note [Replacement servers] in
// ps/replacement.h): requests to the copy left alone say so (kSoleCopy), and once a reply from
// it announces a replacement, this worker's next call on that shard first connects to the
// replacement and says hello there (on the calling thread); the copy is then up again.
//
// The links belong to the Client, not to this state: callbacks keep the state alive, and the
// last owner of a group must never be a callback on that group's own thread (its destructor
// joins that thread). Every group operation of a call ends before the call's Work finishes, so
// the groups outlive every use made of them here. A replacement's link is made by the Client
// too (`connect`), and the lost link it replaces stays with the Client until it goes.
//
// Threading: submit() on the Client's issuing thread; the exchanges' callbacks on the links'
// threads. mu_ guards the links, which copies are up, and the replacements announced.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/work.h"
#include "ps/client.h"
#include "ps/protocol.h"

namespace shoal::ps {

class Client::Replicas : public std::enable_shared_from_this<Client::Replicas> {
 public:
  // Makes (and keeps) the pair group named so, as the worker's rank 1; throws what failed.
  using Connect = std::function<comm::Group*(const std::string& name)>;

  // links: shard s's primary at 2s, its backup at 2s + 1 (owned by the Client). `hello` is
  // what the servers were told at the start, for a replacement.
  Replicas(std::vector<comm::Group*> links, int worker, int servers,
           std::chrono::nanoseconds timeout, std::string hello, Connect connect);

  // Runs exchange `x` on shard s's copies (Note [Replicated shards]); the Work finishes once
  // the call is settled.
  std::shared_ptr<comm::Work> submit(int s, std::shared_ptr<Exchange> x);

  uint64_t failovers() const;

  // The link to copy `i` (shard s: 2s primary, 2s + 1 backup) now: a replacement's once one
  // took the copy over.
  comm::Group& link(size_t i) const;

 private:
  static constexpr int kPrimary = 0, kBackup = 1;

  int backupHost(int s) const { return (s + 1) % servers_; }
  // A failed exchange's server is of no more use: it did not answer, or it answered that it
  // failed (it lost another worker, or another worker gave up on it).
  static bool lost(const Exchange& x) {
    return !x.answered || x.reply.status == static_cast<uint32_t>(Status::kFailed);
  }
  bool isUp(int s, int which) const;
  // A reply from shard s's copy that is alone may announce the other copy's replacement.
  void note(int s, const Reply& reply);
  // On the calling thread, before a request to shard s: connects to an announced replacement
  // of its lost copy and says hello. A replacement that cannot be reached is left, with one
  // warning; the shard goes on with the copy it has.
  void rejoinIfAnnounced(int s);
  void settle(int s, const std::shared_ptr<Exchange>& x, const std::shared_ptr<Exchange>& copy,
              const std::shared_ptr<comm::Work>& result, std::exception_ptr ep,
              std::exception_ptr eb);
  // The shard's backup alone (its primary was lost).
  std::shared_ptr<comm::Work> onBackup(int s, std::shared_ptr<Exchange> x);
  void lose(int s, int which, const std::exception_ptr& why);

  const int worker_, servers_;
  const std::chrono::nanoseconds timeout_;
  const std::string hello_;
  const Connect connect_;
  mutable std::mutex mu_;
  std::vector<comm::Group*> links_;  // shard s: 2s primary, 2s + 1 backup
  std::vector<char> up_;
  // Per shard: the newest replacement announced, and the newest one this worker tried.
  std::vector<int64_t> announced_, tried_;
  uint64_t failovers_ = 0;
};

}  // namespace shoal::ps
