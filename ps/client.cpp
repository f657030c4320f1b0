#include "ps/client.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"
#include "ps/replacement.h"
#include "ps/trace_spans.h"

namespace shoal::ps {

struct Client::Stats {
  std::mutex mu;
  std::vector<int64_t> leads;
  Traffic traffic;
  bool failed = false;  // a call failed
};

namespace {

// Margin over the world timeout: a server that gives up waiting for other workers says so
// (naming them) before this worker's own deadline passes.
constexpr auto kReplyMargin = std::chrono::seconds(15);

// A request the server refused (InvalidArgument: a wrong shape, a step already applied): the
// server keeps serving this worker.
bool refused(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument&) {
    return true;
  } catch (...) {
    return false;
  }
}

// A Work that finishes once every part did, with the first error; onSuccess runs before it
// finishes when none failed, then onFinish (if any) with the outcome, before any waiter wakes.
std::shared_ptr<comm::Work> allOf(const std::vector<std::shared_ptr<comm::Work>>& parts,
                                  std::function<void()> onSuccess,
                                  std::function<void(std::exception_ptr)> onFinish = nullptr) {
  auto all = std::make_shared<comm::Work>();
  struct State {
    std::mutex mu;
    size_t left;
    std::exception_ptr first;
  };
  auto state = std::make_shared<State>();
  state->left = parts.size();
  auto finishAll = [all, onSuccess, onFinish](std::exception_ptr error) {
    if (!error && onSuccess) {
      try {
        onSuccess();
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (onFinish) {
      try {
        onFinish(error);
      } catch (...) {
        // Only a trace span is made there: losing it must not fail the call.
      }
    }
    all->finish(error);
  };
  if (parts.empty()) {
    finishAll(nullptr);
    return all;
  }
  for (const auto& part : parts) {
    part->onDone([state, finishAll](std::exception_ptr error) {
      std::exception_ptr first;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (error && !state->first) state->first = error;
        if (--state->left > 0) return;
        first = state->first;
      }
      finishAll(first);
    });
  }
  return all;
}

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

void setShape(Request& rq, const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    SHOAL_THROW(InvalidArgument, "a tensor of {} dimensions (parameter servers take up to {})",
                shape.size(), kMaxDims);
  }
  rq.ndim = static_cast<uint8_t>(shape.size());
  std::copy(shape.begin(), shape.end(), rq.shape);
}

}  // namespace

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
class Client::Replicas : public std::enable_shared_from_this<Client::Replicas> {
 public:
  // Makes (and keeps) the pair group named so, as the worker's rank 1; throws what failed.
  using Connect = std::function<comm::Group*(const std::string& name)>;

  // links: shard s's primary at 2s, its backup at 2s + 1 (owned by the Client). `hello` is
  // what the servers were told at the start, for a replacement.
  Replicas(std::vector<comm::Group*> links, int worker, int servers,
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

  std::shared_ptr<comm::Work> submit(int s, std::shared_ptr<Exchange> x) {
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

  uint64_t failovers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failovers_;
  }

  // The link to copy `i` (shard s: 2s primary, 2s + 1 backup) now: a replacement's once one
  // took the copy over.
  comm::Group& link(size_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return *links_[i];
  }

 private:
  static constexpr int kPrimary = 0, kBackup = 1;

  int backupHost(int s) const { return (s + 1) % servers_; }

  // A failed exchange's server is of no more use: it did not answer, or it answered that it
  // failed (it lost another worker, or another worker gave up on it).
  static bool lost(const Exchange& x) {
    return !x.answered || x.reply.status == static_cast<uint32_t>(Status::kFailed);
  }

  bool isUp(int s, int which) const {
    std::lock_guard<std::mutex> lock(mu_);
    return up_[2 * s + which] != 0;
  }

  // A reply from shard s's copy that is alone may announce the other copy's replacement.
  void note(int s, const Reply& reply) {
    const int64_t k = announcedReplacement(reply.flags);
    if (k == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    announced_[s] = std::max(announced_[s], k);
  }

  // On the calling thread, before a request to shard s: connects to an announced replacement
  // of its lost copy and says hello. A replacement that cannot be reached is left, with one
  // warning; the shard goes on with the copy it has.
  void rejoinIfAnnounced(int s) {
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
    const char* copy = which == kPrimary ? "primary" : "backup";
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
    SHOAL_LOG_WARN("worker {}: shard {}'s {} is back on server {} (replacement {})", worker_, s,
                   copy, server, k);
  }

  void settle(int s, const std::shared_ptr<Exchange>& x, const std::shared_ptr<Exchange>& copy,
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

  static void forward(const std::shared_ptr<comm::Work>& from,
                      const std::shared_ptr<comm::Work>& to) {
    from->onDone([to](std::exception_ptr e) { to->finish(e); });
  }

  // The shard's backup alone (its primary was lost).
  std::shared_ptr<comm::Work> onBackup(int s, std::shared_ptr<Exchange> x) {
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
        e = std::make_exception_ptr(PeerError(fmt::format(
            "worker {}: shard {} lost both copies (its primary, server {}, earlier): {}",
            self->worker_, s, s, messageOf(e))));
      }
      result->finish(e);
    });
    return result;
  }

  void lose(int s, int which, const std::exception_ptr& why) {
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

Client::Client(comm::Group& world, int worker, int numWorkers, int numServers,
               std::vector<KeySpec> keys, const TrainingConfig& config,
               const ClientOptions& options)
    : world_(world),
      worker_(worker),
      numServers_(numServers),
      partition_(std::move(keys), numServers),
      timeout_(world.options().timeout + kReplyMargin),
      pullHalf_(options.pullHalf),
      stats_(std::make_shared<Stats>()) {
  SHOAL_CHECK(numWorkers >= 1 && worker >= 0 && worker < numWorkers, "worker {} of {}", worker,
              numWorkers);
  config.validate();
  if (pushEncoding(options.compression) != Encoding::kRaw) {
    encoder_ = std::make_unique<PushEncoder>(options.compression, partition_);
  }
  if (options.replicas != 1 && options.replicas != 2) {
    SHOAL_THROW(InvalidArgument, "parameter-server replicas {}: 1 or 2", options.replicas);
  }
  const std::string hello = config.toText() + "\n" + partition_.keysText();
  if (options.replicas == 2) {
    if (numServers < 2) {
      SHOAL_THROW(InvalidArgument,
                  "parameter-server replicas 2 need at least 2 servers (the job has {})",
                  numServers);
    }
    std::vector<comm::Group*> links;
    for (int s = 0; s < numServers; ++s) {
      links_.push_back(world.connect(pairName(s, worker), 1, 2));
      links_.push_back(world.connect(backupPairName(s, worker), 1, 2));
      links.push_back(links_[2 * s].get());
      links.push_back(links_[2 * s + 1].get());
    }
    // A replacement's link (Note [Replacement servers]): kept with the others, so that it
    // outlives every operation on it and is interrupted when this worker leaves.
    auto connect = [this](const std::string& name) {
      links_.push_back(world_.connect(name, 1, 2));
      return links_.back().get();
    };
    replicas_ = std::make_shared<Replicas>(std::move(links), worker, numServers, timeout_, hello,
                                           std::move(connect));
  } else {
    for (int s = 0; s < numServers; ++s) {
      links_.push_back(world.connect(pairName(s, worker), 1, 2));
    }
  }

  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kHello);
    x->request.bytes = hello.size();
    x->payload = hello.data();
    works.push_back(submit(s, x));
    xs.push_back(x);
  }
  allOf(works, nullptr)->wait();
  startStep_ = static_cast<int64_t>(xs[0]->reply.step);
  for (int s = 0; s < numServers; ++s) {
    if (static_cast<int64_t>(xs[s]->reply.step) != startStep_) {
      SHOAL_THROW(InvalidArgument,
                  "worker {}: parameter servers 0 and {} resume from different steps ({} and "
                  "{}); their checkpoints do not belong together",
                  worker, s, startStep_, xs[s]->reply.step);
    }
    mustInitialize_ = mustInitialize_ || (xs[s]->reply.flags & kNeedsInit) != 0;
  }
}

Client::~Client() {
  if (finished_) return;
  bool failed = std::uncaught_exceptions() > 0;
  {
    std::lock_guard<std::mutex> lock(stats_->mu);
    failed = failed || stats_->failed;
  }
  if (failed) {
    // Leaving after a failure: a goodbye would tell the servers that this worker is done, and
    // a synchronous step would then wait for its next push until the timeout, holding every
    // other worker. Leaving fails their waits at once, naming this worker.
    for (const auto& link : links_) {
      if (link) link->interrupt();
    }
    return;
  }
  try {
    finish();
  } catch (const std::exception&) {
    // Destructors must not throw; finish() reports to callers who want to know.
  }
}

void Client::initialize(const float* flat) {
  SHOAL_CHECK(mustInitialize_, "worker {}: the servers are already initialized", worker_);
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kInit);
    x->request.bytes = partition_.elements(s) * sizeof(float);
    x->payload = flat + partition_.begin(s);
    works.push_back(submit(s, x));
  }
  allOf(works, nullptr)->wait();
  mustInitialize_ = false;
}

std::shared_ptr<comm::Work> Client::push(const float* flat, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPush), flat, nullptr, step);
}

std::shared_ptr<comm::Work> Client::pull(float* flat, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPull), nullptr, flat, step);
}

std::shared_ptr<comm::Work> Client::pushPull(const float* grads, float* values, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPushPull), grads, values, step);
}

std::shared_ptr<comm::Work> Client::whole(int kind, const float* payload, float* into,
                                          int64_t step) {
  SHOAL_CHECK(step >= 0, "worker {}: step {}", worker_, step);
  std::optional<TraceSpan> span = beginCallSpan(
      world_.options().trace.get(), static_cast<RequestKind>(kind), worker_, step, nullptr);
  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    Request& rq = x->request;
    rq.kind = static_cast<uint32_t>(kind);
    rq.key = kAllKeys;
    rq.dtype = static_cast<uint8_t>(DataType::kFloat32);
    rq.step = static_cast<uint64_t>(step);
    if (payload) setPush(*x, partition_.pieces(s), payload + partition_.begin(s), step);
    if (into) setPull(*x, partition_.elements(s), into + partition_.begin(s));
    works.push_back(submit(s, x));
    xs.push_back(std::move(x));
  }
  return allExchanges(kind, std::move(xs), std::move(works), into != nullptr, std::move(span));
}

std::shared_ptr<comm::Work> Client::submit(int shard, std::shared_ptr<Exchange> x) {
  if (replicas_) return replicas_->submit(shard, std::move(x));
  return submitExchange(*links_[shard], shard, worker_, std::move(x), timeout_);
}

void Client::setPush(Exchange& x, std::span<const Piece> pieces, const float* grad, int64_t step) {
  Request& rq = x.request;
  const Encoding e = encoder_ ? encoder_->encodingAt(step) : Encoding::kRaw;
  rq.encoding = static_cast<uint8_t>(e);
  if (e == Encoding::kRaw) {
    size_t count = 0;
    for (const Piece& p : pieces) count += p.count;
    rq.bytes = count * sizeof(float);
    x.payload = grad;
    return;
  }
  encoder_->encode(e, pieces, grad, x.packed);
  if (e == Encoding::kTopK) rq.density = encoder_->density();
  rq.bytes = x.packed.size();
  x.payload = x.packed.data();
}

void Client::setPull(Exchange& x, size_t count, float* into) {
  Request& rq = x.request;
  rq.pullEncoding = static_cast<uint8_t>(pullHalf_ ? Encoding::kFp16 : Encoding::kRaw);
  rq.pullBytes = pullPayloadBytes(rq.pullEncoding, count);
  x.into = into;
}

std::shared_ptr<comm::Work> Client::allExchanges(int kind,
                                                 std::vector<std::shared_ptr<Exchange>> xs,
                                                 std::vector<std::shared_ptr<comm::Work>> works,
                                                 bool leads, std::optional<TraceSpan> span) {
  const auto k = static_cast<RequestKind>(kind);
  const bool pushes = k == RequestKind::kPush || k == RequestKind::kPushPull;
  const bool pulls = k == RequestKind::kPull || k == RequestKind::kPushPull;
  std::function<void(std::exception_ptr)> onFinish;
  if (span) {
    // Recorded before the Work finishes: a waiter finds the span in the sink.
    onFinish = [sink = world_.options().trace, span = std::move(*span), xs,
                k](std::exception_ptr error) { endCallSpan(*sink, span, k, xs, error); };
  }
  onFinish = [stats = stats_, trace = std::move(onFinish)](std::exception_ptr error) {
    if (error && !refused(error)) {
      std::lock_guard<std::mutex> lock(stats->mu);
      stats->failed = true;
    }
    if (trace) trace(error);
  };
  auto count = [xs = std::move(xs), stats = stats_, pushes, pulls, leads] {
    int64_t lead = 0;
    Traffic t;
    for (const auto& x : xs) {
      lead = std::max(lead,
                      static_cast<int64_t>(x->reply.step) - static_cast<int64_t>(x->reply.slowest));
      t.pushedBytes += x->request.bytes;
      if (x->into) t.pulledBytes += x->reply.bytes;
    }
    std::lock_guard<std::mutex> lock(stats->mu);
    if (leads) stats->leads.push_back(lead);
    Traffic& total = stats->traffic;
    total.pushes += pushes ? 1 : 0;
    total.pulls += pulls ? 1 : 0;
    total.pushedBytes += t.pushedBytes;
    total.pulledBytes += t.pulledBytes;
  };
  return allOf(works, std::move(count), std::move(onFinish));
}

std::shared_ptr<comm::Work> Client::pushKey(const std::string& key, const void* data,
                                            DataType dtype, const std::vector<int64_t>& shape,
                                            int64_t step) {
  return keyed(static_cast<int>(RequestKind::kPush), key, data, nullptr, dtype, shape, step);
}

std::shared_ptr<comm::Work> Client::pullKey(const std::string& key, void* data, DataType dtype,
                                            const std::vector<int64_t>& shape, int64_t step) {
  return keyed(static_cast<int>(RequestKind::kPull), key, nullptr, data, dtype, shape, step);
}

std::shared_ptr<comm::Work> Client::keyed(int kind, const std::string& key, const void* payload,
                                          void* into, DataType dtype,
                                          const std::vector<int64_t>& shape, int64_t step) {
  const int k = partition_.find(key);
  if (k < 0) SHOAL_THROW(InvalidArgument, "worker {}: no parameter-server key '{}'", worker_, key);
  std::optional<TraceSpan> span = beginCallSpan(
      world_.options().trace.get(), static_cast<RequestKind>(kind), worker_, step, &key);
  const KeySpec& spec = partition_.keys()[k];
  auto pieces = partition_.piecesOf(k);
  const bool matches = dtype == spec.dtype && shape == spec.shape;
  if (!matches) {
    // Sent whole and without data, so the server (which decides) refuses it; a buffer of
    // another shape is never sliced by this key's pieces.
    Piece first;
    first.server = pieces.empty() ? 0 : pieces[0].server;
    pieces.assign(1, first);
  }
  // A matching buffer is float32 (every key is: Partition).
  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (const Piece& p : pieces) {
    auto x = std::make_shared<Exchange>();
    Request& rq = x->request;
    rq.kind = static_cast<uint32_t>(kind);
    rq.key = k;
    rq.dtype = static_cast<uint8_t>(dtype);
    setShape(rq, shape);
    rq.step = static_cast<uint64_t>(step);
    if (matches && payload) {
      setPush(*x, std::span(&p, 1), static_cast<const float*>(payload) + p.offset, step);
    }
    if (matches && into) setPull(*x, p.count, static_cast<float*>(into) + p.offset);
    works.push_back(submit(p.server, x));
    xs.push_back(std::move(x));
  }
  return allExchanges(kind, std::move(xs), std::move(works), false, std::move(span));
}

void Client::finish() {
  if (finished_) return;
  finished_ = true;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kBye);
    works.push_back(submit(s, x));
  }
  allOf(works, nullptr)->wait();
}

std::vector<int64_t> Client::leads() const {
  std::lock_guard<std::mutex> lock(stats_->mu);
  return stats_->leads;
}

Traffic Client::traffic() const {
  std::lock_guard<std::mutex> lock(stats_->mu);
  return stats_->traffic;
}

comm::Group& Client::link(int server) {
  SHOAL_CHECK(server >= 0 && server < numServers_, "server {} of {}", server, numServers_);
  if (replicas_) return replicas_->link(2 * static_cast<size_t>(server));
  return *links_.at(static_cast<size_t>(server));
}

uint64_t Client::failovers() const {
  return replicas_ ? replicas_->failovers() : 0;
}

const std::vector<float>& Client::residual() const {
  static const std::vector<float> kNone;
  return encoder_ ? encoder_->residual() : kNone;
}

}  // namespace shoal::ps
