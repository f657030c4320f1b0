// Note [Replicated shards], the worker's side: Client::Replicas (ps/client_replicas.h).
#include "ps/client_replicas.h"

#include <algorithm>
#include <exception>

#include "common/error.h"
#include "common/log.h"
#include "ps/replacement.h"

namespace shoal::ps {

namespace {

// Calls `fn(errorOfA, errorOfB)` once both finished; `b` may be null (no error from it).
void whenBoth(const std::shared_ptr<comm::Work>& a, const std::shared_ptr<comm::Work>& b,
              std::function<void(std::exception_ptr, std::exception_ptr)> fn) {
  if (!b) {
    a->onDone([fn](std::exception_ptr e) { fn(e, nullptr); });
    return;
  }
  struct State {
    std::mutex mu;
    int left = 2;
    std::exception_ptr a, b;
  };
  auto state = std::make_shared<State>();
  auto done = [state, fn](bool first, std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      (first ? state->a : state->b) = e;
      if (--state->left > 0) return;
    }
    fn(state->a, state->b);
  };
  a->onDone([done](std::exception_ptr e) { done(true, e); });
  b->onDone([done](std::exception_ptr e) { done(false, e); });
}

std::string messageOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

void forward(const std::shared_ptr<comm::Work>& from, const std::shared_ptr<comm::Work>& to) {
  from->onDone([to](std::exception_ptr e) { to->finish(e); });
}

}  // namespace

Client::Replicas::Replicas(std::vector<comm::Group*> links, int worker, int servers,
                           std::chrono::nanoseconds timeout, std::string hello, Connect connect)
    : worker_(worker),
      servers_(servers),
      timeout_(timeout),
      hello_(std::move(hello)),
      connect_(std::move(connect)),
      links_(std::move(links)),
      up_(2 * static_cast<size_t>(servers), 1),
      announced_(static_cast<size_t>(servers), 0),
      tried_(static_cast<size_t>(servers), 0) {}

std::shared_ptr<comm::Work> Client::Replicas::submit(int s, std::shared_ptr<Exchange> x) {
  rejoinIfAnnounced(s);
  const auto kind = static_cast<RequestKind>(x->request.kind);
  if (!isUp(s, kPrimary)) return onBackup(s, std::move(x));
  if (!isUp(s, kBackup)) x->request.flags |= kSoleCopy;
  auto first = submitExchange(link(2 * s), s, worker_, x, timeout_);
  std::shared_ptr<Exchange> copy;
  std::shared_ptr<comm::Work> second;
  if (kind != RequestKind::kPull && isUp(s, kBackup)) {
    copy = std::make_shared<Exchange>();
    copy->request = x->request;
    copy->payload = x->payload;
    if (kind == RequestKind::kPushPull) {
      copy->request.kind = static_cast<uint32_t>(RequestKind::kPush);
      copy->request.pullBytes = 0;
      copy->request.pullEncoding = 0;
    }
    second = submitExchange(link(2 * s + 1), backupHost(s), worker_, copy, timeout_);
  }
  auto result = std::make_shared<comm::Work>();
  whenBoth(first, second,
           [self = shared_from_this(), s, x, copy, result](std::exception_ptr ep,
                                                           std::exception_ptr eb) {
             self->settle(s, x, copy, result, ep, eb);
           });
  return result;
}

uint64_t Client::Replicas::failovers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failovers_;
}

comm::Group& Client::Replicas::link(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return *links_[i];
}

bool Client::Replicas::isUp(int s, int which) const {
  std::lock_guard<std::mutex> lock(mu_);
  return up_[2 * s + which] != 0;
}

void Client::Replicas::note(int s, const Reply& reply) {
  const int64_t k = announcedReplacement(reply.flags);
  if (k == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  announced_[s] = std::max(announced_[s], k);
}

void Client::Replicas::rejoinIfAnnounced(int s) {
  int which = -1;
  int64_t k = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (announced_[s] <= tried_[s]) return;
    k = tried_[s] = announced_[s];
    if (!up_[2 * s + kPrimary] && up_[2 * s + kBackup]) which = kPrimary;
    if (up_[2 * s + kPrimary] && !up_[2 * s + kBackup]) which = kBackup;
  }
  if (which < 0) return;
  const int server = which == kPrimary ? s : backupHost(s);
  const std::string usual = which == kPrimary ? pairName(s, worker_) : backupPairName(s, worker_);
  const char* copy = copyName(which == kBackup);
  comm::Group* g = nullptr;
  try {
    g = connect_(replacementPairName(usual, k));
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kHello);
    x->request.bytes = hello_.size();
    x->payload = hello_.data();
    submitExchange(*g, server, worker_, x, timeout_)->wait();
  } catch (const std::exception& e) {
    if (g) g->interrupt();
    SHOAL_LOG_WARN(
        "worker {}: the replacement of shard {}'s {} on server {} could not be reached ({}); "
        "shard {} goes on with one copy",
        worker_, s, copy, server, e.what(), s);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    links_[2 * s + which] = g;
    up_[2 * s + which] = 1;
  }
  SHOAL_LOG_WARN("worker {}: shard {}'s {} is back on server {} (replacement {})", worker_, s, copy,
                 server, k);
}

void Client::Replicas::settle(int s, const std::shared_ptr<Exchange>& x,
                              const std::shared_ptr<Exchange>& copy,
                              const std::shared_ptr<comm::Work>& result, std::exception_ptr ep,
                              std::exception_ptr eb) {
  const bool primaryLost = ep && lost(*x);
  if (copy && eb && (lost(*copy) || !ep)) {
    // Gone, or out of step with the primary (it answered a failure the primary did not).
    lose(s, kBackup, eb);
    if (primaryLost) {
      result->finish(std::make_exception_ptr(
          PeerError(fmt::format("worker {}: shard {} lost both copies: {}; and its backup: {}",
                                worker_, s, messageOf(ep), messageOf(eb)))));
      return;
    }
  }
  if (!primaryLost) {
    if (!ep) note(s, x->reply);
    result->finish(ep);
    return;
  }
  lose(s, kPrimary, ep);
  const auto kind = static_cast<RequestKind>(x->request.kind);
  if (copy) x->reply = copy->reply;  // the push's numbers, from the replica that applied it
  if (!x->into) {
    // Pushed to the backup already (or, without a copy, never reached a replica: again).
    if (copy) {
      result->finish(nullptr);
    } else {
      forward(onBackup(s, x), result);
    }
    return;
  }
  // The values: from the backup, after this call's push there (same link, issue order).
  auto pull = std::make_shared<Exchange>();
  pull->request = x->request;
  pull->request.kind = static_cast<uint32_t>(RequestKind::kPull);
  pull->request.bytes = 0;
  pull->request.encoding = 0;
  if (kind == RequestKind::kPushPull) pull->request.step += 1;
  pull->into = x->into;
  auto work = onBackup(s, pull);
  work->onDone([x, pull, result](std::exception_ptr e) {
    x->reply = pull->reply;
    result->finish(e);
  });
}

std::shared_ptr<comm::Work> Client::Replicas::onBackup(int s, std::shared_ptr<Exchange> x) {
  auto result = std::make_shared<comm::Work>();
  if (!isUp(s, kBackup)) {
    result->finish(std::make_exception_ptr(PeerError(fmt::format(
        "worker {}: shard {} has no copy left: parameter server {} and its backup on server {} "
        "were lost",
        worker_, s, s, backupHost(s)))));
    return result;
  }
  x->request.flags |= kSoleCopy;
  auto work = submitExchange(link(2 * s + 1), backupHost(s), worker_, x, timeout_);
  work->onDone([self = shared_from_this(), s, x, result](std::exception_ptr e) {
    if (!e) self->note(s, x->reply);
    if (e && lost(*x)) {
      self->lose(s, kBackup, e);
      e = std::make_exception_ptr(PeerError(
          fmt::format("worker {}: shard {} lost both copies (its primary, server {}, earlier): {}",
                      self->worker_, s, s, messageOf(e))));
    }
    result->finish(e);
  });
  return result;
}

void Client::Replicas::lose(int s, int which, const std::exception_ptr& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!up_[2 * s + which]) return;
    up_[2 * s + which] = 0;
    ++failovers_;
  }
  // Its server sees this worker leave (a stalled one stops waiting for it).
  link(2 * s + which).interrupt();
  if (which == kPrimary) {
    SHOAL_LOG_WARN(
        "worker {}: parameter server {} lost ({}); shard {} continues on its backup "
        "on server {}",
        worker_, s, messageOf(why), s, backupHost(s));
  } else {
    SHOAL_LOG_WARN(
        "worker {}: the backup of shard {} on server {} lost ({}); shard {} "
        "continues unreplicated on server {}",
        worker_, s, backupHost(s), messageOf(why), s, s);
  }
}

}  // namespace shoal::ps
