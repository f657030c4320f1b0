#include "transport/endpoint.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/reduce.h"
#include "transport/acceptor.h"
#include "transport/shm/doorbell.h"

namespace shoal::transport {

namespace {
constexpr size_t kHeaderBytes = sizeof(FrameHeader);
constexpr size_t kStagingBytes = 256 << 10;
// Note [Waiting before the set-up]: at most a few microseconds (a PAUSE is 10-140 cycles).
constexpr int kSpinsBeforeSetUp = 128;
constexpr size_t kPieceBytes = 256 << 10;    // the most one zero-copy piece hands on at once
constexpr uint32_t kWakeToken = UINT32_MAX;  // epoll data of the mesh's wakeFd()
}  // namespace

namespace {
// The plan of an endpoint whose links are all given: no records, nothing to dial.
LinkPlan givenPlan(int rank, int size, const std::vector<std::unique_ptr<Link>>& links,
                   std::shared_ptr<shm::Segment> bell) {
  LinkPlan plan;
  plan.rank = rank;
  plan.size = size;
  plan.bell = std::move(bell);
  plan.kinds.assign(static_cast<size_t>(size), LinkKind::kTcp);
  for (int p = 0; p < size; ++p) {
    if (links.at(p)) plan.kinds[p] = links[p]->kind();
  }
  return plan;
}
}  // namespace

Endpoint::Endpoint(int rank, int size, std::vector<std::unique_ptr<Link>> links,
                   std::shared_ptr<shm::Segment> ownBell, EndpointOptions options)
    : rank_(rank),
      size_(size),
      links_(static_cast<size_t>(size)),
      mesh_(std::make_shared<Mesh>(givenPlan(rank, size, links, ownBell))),
      ownBell_(std::move(ownBell)),
      options_(options) {
  init();
  for (int p = 0; p < size_; ++p) {
    if (!links[p]) continue;
    mesh_->adopt(p);
    install(p, std::move(links[p]), true);
  }
}

Endpoint::Endpoint(std::shared_ptr<Mesh> mesh, std::shared_ptr<Acceptor> acceptor,
                   EndpointOptions options)
    : rank_(mesh->plan().rank),
      size_(mesh->plan().size),
      links_(static_cast<size_t>(size_)),
      mesh_(std::move(mesh)),
      acceptor_(std::move(acceptor)),
      ownBell_(mesh_->plan().bell),
      options_(options) {
  init();
  if (acceptor_) acceptor_->add(mesh_);
}

void Endpoint::init() {
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throwSystemError("epoll_create1", errno);
  staging_.resize(static_cast<size_t>(size_));
  midFrame_.assign(static_cast<size_t>(size_), 0);
  departed_.assign(static_cast<size_t>(size_), 0);
  epoll_event wakeEvent{};
  wakeEvent.events = EPOLLIN;
  wakeEvent.data.u32 = kWakeToken;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, mesh_->wakeFd(), &wakeEvent) < 0) {
    throwSystemError("epoll_ctl", errno);
  }
}

void Endpoint::install(int p, std::unique_ptr<Link> link, bool watch) {
  if (link->kind() == LinkKind::kShm && !ownBell_) {
    SHOAL_THROW(InvalidArgument, "rank {}: shared-memory link to {} without a doorbell", rank_, p);
  }
  if (watch) {
    // Edge-triggered: a wake-up per arrival, so data parked for a later operation on a link
    // nobody reads right now cannot keep waking the loop.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = static_cast<uint32_t>(p);
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, link->socketFd(), &ev) < 0) {
      throwSystemError("epoll_ctl", errno);
    }
  }
  std::lock_guard<std::mutex> lock(installMutex_);
  links_[p] = std::move(link);
  // interrupt() came first: this link must not outlive it unharmed.
  if (mesh_->interrupted()) links_[p]->shutdown();
}

void Endpoint::adoptArrivals(bool watch) {
  arrivalsSeen_ = mesh_->arrivals();
  for (auto& [peer, link] : mesh_->takeArrivals()) {
    SHOAL_ASSERT(!links_[peer], "rank {}: a second link to peer {}", rank_, peer);
    install(peer, std::move(link), watch);
  }
}

void Endpoint::connect(int peer, const Deadline& deadline, const std::function<void()>& onSlow) {
  if (mesh_->arrivals() != arrivalsSeen_) adoptArrivals(true);
  if (links_[peer]) return;
  auto link = mesh_->dial(peer, deadline, onSlow, options_.slowAfter);
  if (link) {
    SHOAL_LOG_DEBUG("rank {} → peer {}: {} link made", rank_, peer, toString(link->kind()));
    install(peer, std::move(link), true);
  } else {
    adoptArrivals(true);
  }
  SHOAL_ASSERT(links_[peer] != nullptr, "rank {}: no link to peer {} after connecting", rank_,
               peer);
}

Endpoint::~Endpoint() {
  if (acceptor_) acceptor_->remove(mesh_->plan().groupId, aborted_);
  mesh_->close();
  if (aborted_) return;
  try {
    adoptArrivals(false);
  } catch (...) {
  }
  FrameHeader bye;
  bye.kind = static_cast<uint8_t>(FrameKind::kGoodbye);
  for (int p = 0; p < size_; ++p) {
    if (links_[p] && !(links_[p]->kind() != LinkKind::kShm && midFrame_[p])) {
      sendControl(p, bye, "");
    }
  }
}

bool Endpoint::advanceSend(Transfer& t) {
  Link& link = *links_[t.peer];
  const size_t total = kHeaderBytes + t.header.bytes;
  // What may go now: all of it, or up to the gate of a send-as-ready.
  const size_t payload = t.ready ? std::min<size_t>(*t.ready, t.header.bytes) : t.header.bytes;
  const size_t limit = kHeaderBytes + payload;
  bool progressed = false;
  while (t.done < limit) {
    iovec iov[2];
    int n = 0;
    if (t.done < kHeaderBytes) {
      iov[n++] = {reinterpret_cast<char*>(&t.header) + t.done, kHeaderBytes - t.done};
      if (payload > 0) iov[n++] = {const_cast<void*>(t.src), payload};
    } else {
      iov[n++] = {const_cast<char*>(static_cast<const char*>(t.src)) + (t.done - kHeaderBytes),
                  limit - t.done};
    }
    size_t w = link.writeSome(iov, n);
    if (w == 0) break;
    t.done += w;
    bytesSent_.fetch_add(w, std::memory_order_relaxed);
    progressed = true;
  }
  midFrame_[t.peer] = t.done > 0 && t.done < total;
  return progressed;
}

template <typename Consume>
size_t Endpoint::recvPiecesSome(Transfer& t, Link& link, size_t esize, const Consume& consume) {
  const size_t remaining = t.header.bytes - t.done;
  if (t.carry == 0) {
    // Zero-copy: consume straight out of the shared ring. At most a slice at a time, so that the
    // sender gets the space back while the rest of a large payload still arrives.
    auto [p, avail] = link.peek();
    size_t whole = std::min({avail, remaining, kPieceBytes}) / esize * esize;
    // A ring's record starts 8 bytes into a line (Note [Records] in transport/shm/ring.h), so a
    // payload starts at an 8-byte boundary, not always a 16-byte one; the kernels read elements
    // in place only when they are aligned (else through the staging).
    if (whole > 0 && reinterpret_cast<uintptr_t>(p) % esize == 0) {
      consume(p, t.done, whole);
      link.consume(whole);
      t.done += whole;
      return whole;
    }
  }
  auto& stage = staging_[t.peer];
  if (stage.empty()) stage.resize(kStagingBytes);
  size_t r = link.readSome(stage.data() + t.carry, std::min(remaining, kStagingBytes - t.carry));
  if (r == 0) return 0;
  const size_t consumedUpTo = t.done - t.carry;
  size_t staged = t.carry + r;
  size_t whole = staged / esize * esize;
  if (whole > 0) consume(stage.data(), consumedUpTo, whole);
  t.carry = staged - whole;
  if (t.carry) std::memmove(stage.data(), stage.data() + whole, t.carry);
  t.done += r;
  return r;
}

bool Endpoint::advanceRecv(Transfer& t, Clock::time_point* firstArrival) {
  Link& link = *links_[t.peer];
  bool progressed = false;
  while (t.headerDone < kHeaderBytes) {
    size_t r =
        link.readSome(reinterpret_cast<char*>(&t.got) + t.headerDone, kHeaderBytes - t.headerDone);
    if (r == 0) return progressed;
    t.headerDone += r;
    progressed = true;
  }
  if (t.done == 0 && t.carry == 0 && progressed) {
    if (t.got.magic == kFrameMagic && t.got.kind == static_cast<uint8_t>(FrameKind::kAbort)) {
      readAbortFrame(t.peer, t.got);
    }
    if (t.got.magic == kFrameMagic && t.got.kind == static_cast<uint8_t>(FrameKind::kGoodbye)) {
      departed_[t.peer] = 1;
      throwDeparted(t.peer, t.header);
    }
    checkFrame(t.header, t.got, link.context(), options_.describe);
    // Here, once per frame: untraced, a branch per message; traced, one clock read per operation.
    if (firstArrival != nullptr && *firstArrival == Clock::time_point{}) {
      *firstArrival = Clock::now();
    }
  }
  auto* dst = static_cast<uint8_t*>(t.dst);
  while (t.done < t.header.bytes) {
    size_t r = 0;
    switch (t.kind) {
      case Transfer::Kind::kRecv:
        r = link.readSome(dst + t.done, t.header.bytes - t.done);
        t.done += r;
        break;
      case Transfer::Kind::kRecvReduce: {
        const size_t esize = elementSize(t.dtype);
        r = recvPiecesSome(t, link, esize, [&](const uint8_t* src, size_t at, size_t n) {
          reduceInto(dst + at, src, n / esize, t.dtype, t.redop, t.divisor);
        });
        break;
      }
      case Transfer::Kind::kRecvApply: {
        const PieceHandler& h = t.apply;
        r = recvPiecesSome(t, link, h.grain, [&](const uint8_t* src, size_t at, size_t n) {
          h.fn(h.context, src, at, n);
        });
        break;
      }
      case Transfer::Kind::kSend:
        break;
    }
    if (r == 0) break;
    progressed = true;
    // One piece at a time: the other queues (a reply streamed as this payload is applied, see
    // sendAsReady) get their turn between pieces.
    if (t.kind == Transfer::Kind::kRecvApply) break;
  }
  return progressed;
}

int Endpoint::pollSockets(int timeoutMs, const std::vector<char>& recvPending) {
  // Note [Buffered bytes]: a TLS link may hold records that its socket no longer announces
  // (read ahead with earlier ones, or peeked at by checkSocket). Nobody reads such a link now (a
  // pending receive drains it before the loop sleeps, see progress()), so look at its front
  // before sleeping: an abort or goodbye frame there must not wait for the next packet.
  for (int p = 0; p < size_; ++p) {
    if (links_[p] && !recvPending[p] && !departed_[p] && links_[p]->hasBuffered()) checkSocket(p);
  }
  epoll_event events[64];
  int k = ::epoll_wait(epoll_.get(), events, 64, timeoutMs);
  if (k < 0) {
    if (errno == EINTR) return 0;
    throwSystemError("epoll_wait", errno);
  }
  for (int i = 0; i < k; ++i) {
    if (events[i].data.u32 == kWakeToken) {
      uint64_t drained;
      while (::read(mesh_->wakeFd(), &drained, sizeof(drained)) > 0) {
      }
      continue;
    }
    int peer = static_cast<int>(events[i].data.u32);
    // A TCP link being read is checked by the read itself; every other socket is looked at
    // here, so a peer that died or aborted is noticed even while we wait on someone else.
    if (links_[peer]->kind() == LinkKind::kShm || !recvPending[peer]) checkSocket(peer);
  }
  return k;
}

void Endpoint::run(Transfer* ts, size_t n, const Deadline& deadline,
                   const std::function<void()>& onSlow, Clock::time_point* firstArrival) {
  progress(ts, n, deadline, onSlow, {}, firstArrival);
}

bool Endpoint::runUntil(Transfer* ts, size_t n, const Deadline& deadline,
                        const std::function<bool(Clock::time_point)>& stopEarly) {
  return progress(ts, n, deadline, {}, stopEarly, nullptr);
}

bool Endpoint::tryNow(Transfer& t) {
  if (aborted_ || t.peer < 0 || t.peer >= size_ || t.peer == rank_ || !links_[t.peer] ||
      departed_[t.peer]) {
    return false;
  }
  if (t.kind == Transfer::Kind::kSend) {
    advanceSend(t);
    return t.complete();
  }
  if (t.kind != Transfer::Kind::kRecv) return false;
  advanceRecv(t, nullptr);
  if (t.complete()) return true;
  // Note [Waiting before the set-up]: a reply often arrives within a few hundred nanoseconds,
  // sooner than a receive that found nothing gets through its deadline, its batch's set-up and
  // the checks before it watches the ring (two clock reads among them). A message that came
  // meanwhile waited for them: in an 8 B ping-pong the receiver was still setting up when the
  // reply arrived. So first watch the ring for a bounded spin, without the clock.
  const std::atomic<uint64_t>* watch = links_[t.peer]->arrivalWatch();
  if (watch == nullptr) return false;
  for (int i = 0; i < kSpinsBeforeSetUp; ++i) {
    if (watch->load(std::memory_order_acquire) != 0) {
      advanceRecv(t, nullptr);
      return t.complete();
    }
    shm::cpuRelax();
  }
  return false;
}

void Endpoint::wake() noexcept {
  mesh_->wake();
}

bool Endpoint::progress(Transfer* ts, size_t n, const Deadline& deadline,
                        const std::function<void()>& onSlow,
                        const std::function<bool(Clock::time_point)>& stopEarly,
                        Clock::time_point* firstArrival) {
  if (aborted_) {
    SHOAL_THROW(PeerError, "rank {}: this group failed earlier and cannot be used: {}", rank_,
                abortReason_);
  }
  auto* bell = ownBell_ ? static_cast<shm::DoorbellWord*>(ownBell_->data()) : nullptr;
  bool slowFired = !onSlow;
  // Read only where it is used: a clock read is a tenth of a small message's cost.
  const auto start = slowFired ? Clock::time_point{} : Clock::now();
  // A dial that waits long says so like a blocked transfer (the peer may be stopped).
  const std::function<void()> dialSlow = [&] {
    if (!slowFired) {
      slowFired = true;
      onSlow();
    }
  };
  size_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    Transfer& t = ts[i];
    SHOAL_ASSERT(t.peer >= 0 && t.peer < size_ && t.peer != rank_, "rank {}: transfer to peer {}",
                 rank_, t.peer);
    if (t.kind == Transfer::Kind::kRecvApply) {
      const size_t g = t.apply.grain;
      SHOAL_CHECK(t.apply.fn && g > 0 && g <= kMaxPieceGrain && (g & (g - 1)) == 0 &&
                      t.header.bytes % g == 0,
                  "rank {}: a receive-apply of {} bytes in grains of {}", rank_, t.header.bytes, g);
    }
    if (!links_[t.peer]) connect(t.peer, deadline, slowFired ? nullptr : dialSlow);
    if (departed_[t.peer]) throwDeparted(t.peer, t.header);
    bool send = t.kind == Transfer::Kind::kSend;
    size_t q = 0;
    while (q < used && !(queues_[q].peer == t.peer && queues_[q].send == send)) ++q;
    if (q == used) {
      if (used == queues_.size()) queues_.emplace_back();
      queues_[q].peer = t.peer;
      queues_[q].send = send;
      queues_[q].items.clear();
      queues_[q].front = 0;
      ++used;
    }
    queues_[q].items.push_back(i);
  }
  finished_.assign(n, 0);
  recvBlocked_.assign(static_cast<size_t>(size_), 0);
  auto& finished = finished_;
  auto& recvBlocked = recvBlocked_;
  size_t remaining = n;
  Clock::time_point quietSince{};  // since when nothing moved; Note [Polling TCP]
  // Note [Reading the bell late]: a wait on the doorbell needs its count from before the last
  // look at the links (a ring after that look ends the wait). Reading it at the top of every
  // round put a cross-core miss into each message's path (the writer rings right after it
  // publishes), and the next fence waited for it. So a round first looks without it; only a
  // round that found nothing reads the count and looks once more before it waits.
  uint32_t seen = 0;
  bool counted = bell == nullptr;  // `seen` was read before this round's look
  while (remaining > 0) {
    bool progressed = false, shmPending = false, tcpPending = false;
    // Reset for every peer first: a peer has two queues, and the send queue must not clear
    // what the receive queue set (a socket in the middle of a frame is never peeked).
    std::fill(recvBlocked.begin(), recvBlocked.end(), 0);
    for (size_t qi = 0; qi < used; ++qi) {
      Queue& q = queues_[qi];
      while (q.front < q.items.size()) {
        size_t i = q.items[q.front];
        Transfer& t = ts[i];
        if (t.after >= 0 && !finished[t.after]) break;
        progressed |= q.send ? advanceSend(t) : advanceRecv(t, firstArrival);
        if (!t.complete()) break;
        finished[i] = 1;
        --remaining;
        ++q.front;
      }
      if (q.front < q.items.size()) {
        if (!q.send) recvBlocked[q.peer] = 1;
        (links_[q.peer]->kind() == LinkKind::kShm ? shmPending : tcpPending) = true;
      }
    }
    if (remaining == 0 || progressed) {
      quietSince = {};
      counted = bell == nullptr;
      continue;
    }
    if (!counted && shmPending) {
      seen = bell->seq.load(std::memory_order_acquire);
      counted = true;
      continue;
    }
    // Note [Buffered bytes]: a receive that was attempted read until its link said "nothing
    // more", so no link it waits on can hold decrypted bytes here; were one to, sleeping on its
    // socket could wait forever. Checked, cheaply, rather than assumed.
    bool buffered = false;
    for (size_t qi = 0; qi < used && !buffered; ++qi) {
      const Queue& q = queues_[qi];
      if (q.send || q.front >= q.items.size()) continue;
      const Transfer& t = ts[q.items[q.front]];
      buffered = !(t.after >= 0 && !finished[t.after]) && links_[q.peer]->hasBuffered();
    }
    if (buffered) continue;
    // A peer that said goodbye sends nothing more and reads nothing more: whatever it sent
    // before has been taken by the attempt above (a shared-memory goodbye travels on the
    // socket, apart from the ring's data, so it can be seen before the data is read).
    for (size_t qi = 0; qi < used; ++qi) {
      const Queue& q = queues_[qi];
      if (q.front < q.items.size() && departed_[q.peer]) {
        throwDeparted(q.peer, ts[q.items[q.front]].header);
      }
    }
    // Links peers made meanwhile: watched from now on (an abort on one is seen at once).
    if (mesh_->arrivals() != arrivalsSeen_) adoptArrivals(true);
    // One clock read for the checks and the wait below: a fifth of a small message's cost each.
    const auto now = Clock::now();
    if (stopEarly && stopEarly(now)) return false;
    if (now >= deadline.end()) throwTimeout(ts, n, deadline);
    if (!slowFired && now - start >= options_.slowAfter) {
      slowFired = true;
      onSlow();
    }
    if (shmPending) {
      // Sleep on the doorbell in slices; between slices look at the sockets for a dead or
      // aborting peer (and, with TCP links in the batch, for their data).
      Duration slice = tcpPending ? std::chrono::milliseconds(1) : std::chrono::milliseconds(20);
      slice = std::min(slice, Duration(deadline.end() - now));
      const bool spin = !tcpPending;
      // Note [Watching the ring]: the wait also spins on the first ring this rank waits to read
      // (an empty ring, for a receive free to move): on the stamp of its next record, which
      // shares a line with the record's first bytes (Note [Records] in transport/shm/ring.h).
      // A writer publishes a record before it rings the doorbell, so the reader learns of it
      // there first, and holds the line of a small message's header and payload when the wait
      // ends: one cross-core cache miss per message. The doorbell still ends the wait for
      // everything else, and is all a sleep waits on.
      const std::atomic<uint64_t>* watch = nullptr;
      for (size_t qi = 0; qi < used && spin && watch == nullptr; ++qi) {
        const Queue& q = queues_[qi];
        if (q.send || q.front >= q.items.size()) continue;
        const Transfer& t = ts[q.items[q.front]];
        if (t.after < 0 || finished[t.after]) watch = links_[q.peer]->arrivalWatch();
      }
      if (!shm::waitForRing(bell, seen, spin ? options_.spinTime : Duration(0),
                            spin ? options_.yieldTime : Duration(0), slice, now, watch)) {
        pollSockets(0, recvBlocked);
      }
      counted = false;
    } else {
      // Note [Polling TCP]: going to sleep in epoll_wait at once cost a TCP message about
      // 29 us over loopback (8 B ping-pong; OpenMPI's TCP component, which polls, 6 us). So
      // for spinTime the loop first asks epoll without sleeping, and reads again as soon as a
      // socket is readable; only then it sleeps (8 B: 8 us; a 4 KiB all-reduce of 2 ranks
      // 19 -> 7.6 us; bench/results/p2p.md). It asks epoll rather than reading: a read takes
      // the socket's lock, and reading in a loop while the peer's segments arrive slowed their
      // delivery (a 1 MiB all-reduce of 4 ranks took 35% longer). Then, like the doorbell's
      // wait, it keeps asking for yieldTime more while yielding the core between asks (with
      // more ranks than cores the peer it waits for may be runnable on this one): a loopback
      // round trip is about 9 us, so a rank that slept after 5 us paid a wake-up for most
      // replies (8 B: 9 -> 4.6 us, OpenMPI 4.5; one way 1 MiB 180 -> 120 us; a 4 KiB
      // all-reduce of 4 ranks 47-52 -> 34-35 us; bench/results/p2p.md).
      if (quietSince == Clock::time_point{}) quietSince = now;
      const Duration pollFor = options_.spinTime + options_.yieldTime;
      if (now - quietSince < pollFor) {
        while (pollSockets(0, recvBlocked) == 0) {
          const Duration quiet = Clock::now() - quietSince;
          if (quiet >= pollFor) break;
          if (quiet >= options_.spinTime) sched_yield();
        }
        continue;
      }

      int ms = deadline.remainingMs();
      if (!slowFired) ms = std::min(ms, 100);
      pollSockets(ms, recvBlocked);
    }
  }
  return true;
}

}  // namespace shoal::transport
