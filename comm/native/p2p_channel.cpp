#include "comm/native/p2p_channel.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "comm/native/native_engine.h"
#include "transport/endpoint.h"

namespace shoal::comm {

namespace {

// Note [Waiting chains]: in a pipeline or a ring of point-to-point operations, a stopped rank
// makes its neighbour wait, which makes the next one wait, and so on; each times out on its own
// channel, where its peer looks silent. A channel blocked for a while writes whom it waits on
// (p2pwait/<rank> = peer, in the parent group's store); a channel that times out follows those
// entries from its peer to the first rank that waits on nobody, and names that rank.
constexpr Duration kWaitPostBudget = std::chrono::milliseconds(100);
constexpr Duration kWaitLookupBudget = std::chrono::milliseconds(100);

std::string waitKey(int rank) {
  return fmt::format("p2pwait/{}", rank);
}

// Note [Who drives]: a small message's cost is dominated by thread hand-offs, not by moving
// bytes (~4-5 us each on a 2-core VM, against well under 1 us for the copy). So the thread that
// posts makes one non-blocking attempt, and a thread that waits drives the connection itself
// until its work completes, sleeping in the endpoint (spin, then futex or epoll) rather than on
// a condition variable. The worker only covers work nobody waits on: it takes over when work is
// left and nobody has started driving for kGrace, and it lets go as soon as a waiter asks. A
// waiter never takes over from another waiter: that one completes every transfer it can, so
// the second sleeps on its work instead.
constexpr Duration kGrace = std::chrono::milliseconds(1);

const Deadline& forever() {
  static const Deadline d(std::chrono::hours(24 * 365));
  return d;
}

}  // namespace

P2pChannel::P2pChannel(NativeEngine& parent, int peer, int tag)
    : parent_(parent), rank_(parent.rank()), peer_(peer), tag_(tag), worker_([this] { loop(); }) {}

P2pChannel::~P2pChannel() {
  close();
}

void P2pChannel::close() {
  std::shared_ptr<Group> pair;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    postedWhileDirect_.store(true, std::memory_order_release);  // a transferNow() lets go too
    pair = pair_;
  }
  workerWake_.notify_all();
  released_.notify_all();
  if (pair) nativeEngine(*pair).endpoint().wake();
  if (worker_.joinable()) worker_.join();
  {
    // A driving waiter sees stop_ at its next quiet moment (the wake above ends its sleep).
    std::unique_lock<std::mutex> lock(mutex_);
    released_.wait(lock, [&] { return !driving_; });
  }
  failAll(std::make_exception_ptr(PeerError(
      fmt::format("rank {}: point-to-point with rank {} (tag {}) stopped: its group was destroyed",
                  rank_, peer_, tag_))));
}

void P2pChannel::failAll(std::exception_ptr error) {
  std::vector<Op> ops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_) failed_ = error;
    for (auto& op : incoming_) ops.push_back(std::move(op));
    incoming_.clear();
    if (!driving_) {
      for (auto& op : active_) ops.push_back(std::move(op));
      active_.clear();
      transfers_.clear();
    }
  }
  workerWake_.notify_all();
  released_.notify_all();
  for (auto& op : ops) op.work->finish(error);
}

std::shared_ptr<Work> P2pChannel::makeWork() {
  auto work = std::make_shared<Work>();
  work->setProgress([channel = weak_from_this(), w = work.get()](const Deadline& deadline) {
    if (auto self = channel.lock()) self->progressFor(*w, deadline);
  });
  return work;
}

std::shared_ptr<Work> P2pChannel::post(bool isSend, void* data, size_t count, DataType type,
                                       Duration timeout) {
  auto work = makeWork();
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_ || stop_) {
    auto error = failed_ ? failed_
                         : std::make_exception_ptr(PeerError(fmt::format(
                               "rank {}: point-to-point with rank {} (tag {}): the channel is "
                               "closed",
                               rank_, peer_, tag_)));
    lock.unlock();
    work->finish(error);
    return work;
  }
  incoming_.push_back(Op{isSend, data, count, type, Deadline(timeout), work});
  if (!pair_) {
    // Not connected yet: the worker connects, then drives.
    lock.unlock();
    workerWake_.notify_all();
  } else if (driving_) {
    if (directDriving_) postedWhileDirect_.store(true, std::memory_order_release);
    nativeEngine(*pair_).endpoint().wake();  // the driver takes it at once
  } else {
    // Note [Who drives]: one attempt on this thread; a small send usually completes here.
    driving_ = true;
    ++drives_;
    lock.unlock();
    drive([] { return true; }, true, false, forever());
    lock.lock();
    release(lock);
  }
  return work;
}

void P2pChannel::release(std::unique_lock<std::mutex>& lock) {
  driving_ = false;
  const bool tellWorker = workerIdle_ && hasWork() && !stop_ && !failed_;
  if (tellWorker) workerIdle_ = false;
  lock.unlock();
  released_.notify_all();
  if (tellWorker) workerWake_.notify_all();
}

void P2pChannel::progressFor(const Work& work, const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (work.test() || stop_ || failed_ || !pair_ || deadline.expired()) return;
    if (!driving_) break;
    // Another waiter drives: it completes this work too. The worker lets go at once when asked;
    // a transferNow() hands this work to the general path and lets go (Note [Direct path]).
    if (!workerDriving_ && !directDriving_) return;
    ++waiters_;
    nativeEngine(*pair_).endpoint().wake();
    released_.wait_until(lock, deadline.end(),
                         [&] { return !driving_ || stop_ || failed_ || work.test(); });
    --waiters_;
  }
  driving_ = true;
  ++drives_;
  lock.unlock();
  drive([&] { return work.test(); }, false, false, deadline);
  lock.lock();
  release(lock);
}

// The pair group numbers its ranks 0 and 1; the caller thinks in the parent group's ranks.
// A peer that failed because of a third rank (it died of it, or gave up on it and left) wrote
// that in the parent group's store: the cause travels along chains of channels too
// (Note [Root cause] in comm/native/native_engine.cpp).
std::exception_ptr P2pChannel::translate(std::exception_ptr error) const {
  const int lo = std::min(parent_.rank(), peer_), hi = std::max(parent_.rank(), peer_);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    transport::Failure f;
    f.origin = e.origin() == 0 ? lo : e.origin() == 1 ? hi : -1;
    f.kind = dynamic_cast<const TimeoutError*>(&e)    ? transport::AbortKind::kTimeout
             : dynamic_cast<const MismatchError*>(&e) ? transport::AbortKind::kMismatch
             : dynamic_cast<const ProtocolError*>(&e) ? transport::AbortKind::kProtocol
                                                      : transport::AbortKind::kPeer;
    f.text =
        fmt::format("{} [ranks 0 and 1 here are ranks {} and {} of the group]", e.what(), lo, hi);
    if (f.kind == transport::AbortKind::kTimeout && f.origin == peer_) {
      f.origin = endOfWaitingChain();
    }
    if (f.origin >= 0 && f.origin != parent_.rank()) {
      if (auto record = parent_.abortRecord(f.origin); record && record->origin >= 0) {
        f.origin = record->origin;
        f.text = record->text;
      }
    }
    const bool typed = f.kind != transport::AbortKind::kPeer || dynamic_cast<const PeerError*>(&e);
    if (!typed) return error;
    auto& parent = const_cast<NativeEngine&>(parent_);
    parent.recordFailure(f);
    const std::string message =
        f.origin >= 0
            ? fmt::format(
                  "rank {}: point-to-point with rank {} (tag {}) failed (cause: rank {}): {}",
                  rank_, peer_, tag_, f.origin, f.text)
            : fmt::format("rank {}: point-to-point with rank {} (tag {}) failed: {}",
                          parent_.rank(), peer_, tag_, f.text);
    try {
      transport::throwFailure(f, message);
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return error;
  }
}

int P2pChannel::endOfWaitingChain() const {
  std::vector<char> seen(static_cast<size_t>(parent_.size()), 0);
  seen[parent_.rank()] = 1;
  int at = peer_;
  for (int hop = 0; hop < parent_.size(); ++hop) {
    seen[at] = 1;
    auto next = parent_.diagnostics_.lookup(kWaitLookupBudget, waitKey(at));
    int n = -1;
    if (!next || std::sscanf(next->c_str(), "%d", &n) != 1 || n < 0 || n >= parent_.size() ||
        seen[n]) {
      break;  // `at` waits on nobody (or on a rank already on the chain: a cycle)
    }
    at = n;
  }
  return at;
}

void P2pChannel::loop() {
  std::shared_ptr<Group> pair;
  try {
    // Connect once there is work, within the first operation's deadline.
    Duration timeout;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      workerWake_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      if (stop_) return;  // close() fails what is left
      timeout = incoming_.front().deadline.remaining();
    }
    const int lo = std::min(rank_, peer_), hi = std::max(rank_, peer_);
    // The parent group traces each message (Group::post); the pair's driving sessions, which
    // run as operations of the pair, would only add noise to the timeline.
    GroupOptions pairOptions = parent_.options();
    pairOptions.trace = nullptr;
    pair = Group::create(parent_.connect(fmt::format("p2p-{}-{}-t{}", lo, hi, tag_),
                                         rank_ == lo ? 0 : 1, 2, timeout),
                         std::move(pairOptions));
  } catch (...) {
    failAll(translate(std::current_exception()));
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  pair_ = pair;
  pairEngine_ = &nativeEngine(*pair);
  bool first = true;
  for (;;) {
    if (stop_ || failed_) return;
    if (driving_) {
      // On watch: the thread driving may be a waiter that returns with its own work done and
      // the rest left over, and release() tells only an idle worker. So while anyone drives,
      // look again every kGrace. (Going idle here instead, to be told at each release, woke
      // this thread once per message: both-ways transfers of 256 KiB-1 MiB took up to 40%
      // longer on 2 cores.)
      workerWake_.wait_for(lock, kGrace);
      continue;
    }
    if (!hasWork()) {
      // Idle until told: release() tells an idle worker when work is left.
      workerIdle_ = true;
      workerWake_.wait(lock, [&] { return stop_ || failed_ || !workerIdle_; });
      workerIdle_ = false;
      continue;
    }
    if (!first) {
      // Note [Who drives]: leave the work to a thread that is about to wait on it.
      const uint64_t seen = drives_;
      workerWake_.wait_for(lock, kGrace, [&] { return stop_ || failed_ || drives_ != seen; });
      if (stop_ || failed_ || drives_ != seen || driving_ || !hasWork()) continue;
    }
    first = false;
    driving_ = workerDriving_ = true;
    ++drives_;
    lock.unlock();
    drive(
        [&] {
          std::lock_guard<std::mutex> l(mutex_);
          return stop_ || waiters_ > 0;
        },
        false, true, forever());
    lock.lock();
    workerDriving_ = false;
    driving_ = false;
    released_.notify_all();
  }
}

transport::Transfer P2pChannel::transferOf(bool send, void* data, size_t count, DataType type,
                                           int pairRank, uint32_t pairId) {
  transport::FrameHeader h;
  h.count = count;
  h.dtype = static_cast<uint8_t>(type);
  h.root = static_cast<uint32_t>(tag_);
  h.group = pairId;
  h.op = static_cast<uint8_t>(op::kSendRecv);
  h.seq = send ? sendSeq_++ : recvSeq_++;
  h.bytes = count * elementSize(type);
  return send ? transport::Transfer::send(1 - pairRank, h, data)
              : transport::Transfer::recv(1 - pairRank, h, data);
}

void P2pChannel::postWaiting(Clock::time_point quietSince, Duration slowAfter,
                             Clock::time_point now) {
  if (!waitPosted_ && now - quietSince > slowAfter) {
    waitPosted_ = parent_.diagnostics_.set(kWaitPostBudget, waitKey(rank_), std::to_string(peer_));
  }
}

void P2pChannel::clearWaiting() {
  if (!waitPosted_) return;
  waitPosted_ = false;
  parent_.diagnostics_.run(Duration(0),
                           [key = waitKey(rank_)](store::Store& st) { st.deleteKey(key); });
}

// Note [Direct path]: a blocking send or receive of 8 B through post() and a Work cost about
// 0.75 us one way on shared memory, against OpenMPI's 0.1-0.36 us: the Work and its progress
// callback (allocated), an operation of the pair group around each burst (execute, runOrdered,
// the executor, an OpContext, several std::functions) and the locks of each. When the channel
// is connected and has nothing else to move, transferNow() takes the driver's role under one
// lock and moves its one transfer straight through the pair's endpoint. The channel's rules
// hold as on the general path: the same sequence numbers, the same deadline, failures through
// the pair engine's abort() and translate(). Should another thread post meanwhile, post() sets
// postedWhileDirect_ and wakes the endpoint; the transfer, its progress kept, becomes a Work in
// active_ ahead of what was posted (post order), and the general path moves them all: a second
// thread never waits behind a blocking call (two ranks that each send a large message while
// another thread posts the receive must not deadlock).
bool P2pChannel::transferNow(bool isSend, void* data, size_t count, DataType type,
                             Duration timeout) {
  NativeEngine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pairEngine_ || driving_ || hasWork() || failed_ || stop_) return false;
    driving_ = directDriving_ = true;
    ++drives_;
    postedWhileDirect_.store(false, std::memory_order_relaxed);
    engine = pairEngine_;  // set once, kept until the channel goes
  }
  transport::Transfer t = transferOf(isSend, data, count, type, engine->rank(), engine->id());
  bool done = false;
  std::exception_ptr error;
  std::optional<Op> op;
  try {
    // One attempt first: a send that fits and a message already there complete without the
    // deadline's clock read (a fifth of an 8 B message's cost) or a batch's set-up. The deadline
    // then starts at the first wait, microseconds later than the call at most.
    done = engine->tryNow(t);
    if (!done) {
      op.emplace(Op{isSend, data, count, type, Deadline(timeout), nullptr});
      // Two pointers: the std::function holds them without an allocation.
      done = engine->moveNow(t, op->deadline, [this, &op](Clock::time_point now) {
        postWaiting(op->deadline.start(), waitingAfter(), now);
        return postedWhileDirect_.load(std::memory_order_acquire);
      });
    }
  } catch (...) {
    error = translate(std::current_exception());
  }
  if (done || error) clearWaiting();
  if (error) failAll(error);  // still the driver: later posts fail, nothing else is in flight
  std::shared_ptr<Work> work;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    directDriving_ = false;
    if (!done && !error) {
      // active_ was empty (the channel was idle), and later posts wait in incoming_: this
      // transfer stays first, in post order.
      work = makeWork();
      op->work = work;
      active_.push_back(std::move(*op));
      transfers_.push_back(t);
    }
    release(lock);
  }
  if (error) std::rethrow_exception(error);
  if (work) work->wait();
  return true;
}

Duration P2pChannel::waitingAfter() const {
  return std::min<Duration>(std::chrono::seconds(1), parent_.options().timeout / 4);
}

void P2pChannel::drive(const std::function<bool()>& enough, bool once, bool isWorker,
                       const Deadline& limit) {
  std::shared_ptr<Group> pair;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pair = pair_;
  }
  const Duration slowAfter = waitingAfter();
  const uint32_t pairId = nativeEngine(*pair).id();
  try {
    execute(*pair, op::kSendRecv, transport::FrameHeader{}, {}, [&](OpContext& ctx) {
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (stop_) return;
          for (auto& op : incoming_) {
            transfers_.push_back(
                transferOf(op.send, op.data, op.count, op.type, pair->rank(), pairId));
            active_.push_back(std::move(op));
          }
          incoming_.clear();
        }
        if (active_.empty()) return;
        auto earliest = std::min_element(active_.begin(), active_.end(), [](auto& a, auto& b) {
          return a.deadline.end() < b.deadline.end();
        });
        // The waiter's own limit ends the run through stopEarly, never as a timeout: only an
        // operation's deadline fails the channel.
        Deadline deadline(std::min(earliest->deadline.remaining(), limit.remaining()));
        const auto quietSince = Clock::now();
        const auto stopEarly = [&](Clock::time_point now) {
          postWaiting(quietSince, slowAfter, now);
          if (once || now >= limit.end()) return true;
          // A transfer that completed is finished now, not when the batch is done.
          for (const auto& t : transfers_) {
            if (t.complete()) return true;
          }
          std::lock_guard<std::mutex> lock(mutex_);
          return stop_ || !incoming_.empty() || (isWorker && waiters_ > 0);
        };
        ctx.engine().endpoint().runUntil(transfers_.data(), transfers_.size(), deadline, stopEarly);
        // Complete what is done, keeping the rest in post order.
        size_t kept = 0;
        for (size_t i = 0; i < active_.size(); ++i) {
          if (transfers_[i].complete()) {
            active_[i].work->finish(nullptr);
          } else {
            if (kept != i) {
              active_[kept] = std::move(active_[i]);
              transfers_[kept] = transfers_[i];
            }
            ++kept;
          }
        }
        active_.resize(kept);
        transfers_.resize(kept);
        if (active_.empty()) clearWaiting();
        if (once || limit.expired() || enough()) return;
      }
    });
  } catch (...) {
    // What was in flight fails with the channel's error, and so does everything posted later.
    auto error = translate(std::current_exception());
    for (auto& op : active_) op.work->finish(error);
    active_.clear();
    transfers_.clear();
    failAll(error);
  }
}

}  // namespace shoal::comm
