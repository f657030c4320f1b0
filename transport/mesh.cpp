#include "transport/mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/frame.h"
#include "transport/shm/doorbell.h"

namespace shoal::transport {

// Note [Simultaneous dial]
// Each end of a pair keeps a state for it under its Mesh's mutex: none, dialing (its run
// thread dials), accepting (its acceptor accepted the other end's hello and is setting the link
// up), connected, failed. The run thread dials only from none (→ dialing). The acceptor, given
// an authenticated hello from q at rank r, answers:
//   accept (→ accepting)  if r's state for q is none, or dialing and r > q;
//   collision             if it is dialing and r < q (the lower rank's dial wins), accepting or
//                          connected (some hello was accepted already), or failed (then aborted);
// and a dialer refused with collision keeps its state (dialing, or accepting if its acceptor
// took over meanwhile) and waits for its own acceptor to deliver the link.
// Exactly one connection survives. At most one hello of a pair is accepted: say r < q and both
// were accepted. q's hello was accepted at r with r in none (dialing needs r > q), so r had not
// dialed yet, and from then on r is accepting/connected and never dials: r's hello cannot exist.
// At least one is accepted: if q's hello is refused at r with collision, r is dialing with
// r < q (nothing was accepted yet, so not accepting/connected), so r's hello reaches q while q is
// dialing (it stays so until its own answer, and a collision leaves it so) with q > r: accepted.
// (A dial only ever starts from none, so a refused dialer is dialing or accepting, never none.)
// Nobody waits forever: a dialer refused with collision waits for its acceptor, which by the
// above accepts the other end's hello and finishes the set-up or reports it failed; the other
// end is running its dial (not waiting on anything of ours but the acceptor thread, which
// always answers). If the other end gives up before its hello is sent (it was interrupted or
// aborted), the waiter would only learn at its deadline; so it dials again now and then (from
// 20 ms doubling to 1 s, while still dialing): the other end then answers "aborted", or
// collision again while its own dial is still on its way. Every wait has the caller's deadline.
// A dial that fails (refused as departed or aborted, or nobody listens) while this end's
// acceptor has taken the pair over does not fail the pair: the peer dialed first, sent, and left
// or aborted; its link, with what it sent and then its goodbye or abort, tells the rest.

namespace {

constexpr auto kFirstRedial = std::chrono::milliseconds(20);
// How long a dial waits for the acceptor's greeting before it checks that something still
// listens (when the caller gave no slowAfter of its own).
constexpr auto kGreetingProbeAfter = std::chrono::seconds(1);
constexpr auto kMaxRedial = std::chrono::seconds(1);

// One attempt, no retry: the peer's acceptor listens from its world's creation until its last
// group is gone, so a refusal means the peer is gone (unlike at start-up, nothing to wait for).
Fd connectOnce(const HostPort& addr, const Deadline& deadline, int peer, const std::string& what) {
  auto ip = resolveIPv4(addr.host);
  if (!ip) SHOAL_THROW(InvalidArgument, "{}: cannot resolve {}", what, addr.host);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(addr.port));
  ::inet_pton(AF_INET, ip->c_str(), &sa.sin_addr);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) throwSystemError("socket", errno);
  int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  int err = rc == 0 ? 0 : errno;
  if (rc < 0 && err == EINPROGRESS) {
    if (!pollFor(fd.get(), POLLOUT, deadline)) {
      TimeoutError e(fmt::format("{}: could not connect to {} within {:.1f} s", what, addr.str(),
                                 deadline.timeoutSeconds()));
      e.setOrigin(peer);
      throw e;
    }
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  }
  // The peer's acceptor is gone and this socket took its port as its own source port: it would
  // wait for a greeting from itself until the deadline (seen as a 60 s wait in CI).
  if (err == 0 && isSelfConnected(fd.get())) err = ECONNREFUSED;
  if (err != 0) {
    throw ConnectionLost(fmt::format("{}: peer {} is gone (its acceptor at {}: {})", what, peer,
                                     addr.str(), std::strerror(err)),
                         peer);
  }
  setNoDelay(fd.get());
  return fd;
}

}  // namespace

Mesh::Mesh(LinkPlan plan)
    : plan_(std::move(plan)),
      wakeFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      state_(static_cast<size_t>(plan_.size), State::kNone),
      failure_(static_cast<size_t>(plan_.size)) {
  if (!wakeFd_.valid()) throwSystemError("eventfd", errno);
}

void Mesh::wakeLocked() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wakeFd_.get(), &one, sizeof(one));
  if (plan_.bell) shm::ring(static_cast<shm::DoorbellWord*>(plan_.bell->data()));
}

void Mesh::wake() noexcept {
  wakeLocked();  // touches nothing the mutex guards
}

void Mesh::adopt(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.at(peer) = State::kConnected;
}

bool Mesh::connected(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_.at(peer) == State::kConnected;
}

int Mesh::connectedCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(std::count(state_.begin(), state_.end(), State::kConnected));
}

bool Mesh::waitConnected(int peer, const Deadline& deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_until(lock, deadline.end(), [&] {
    return state_.at(peer) == State::kConnected || state_[peer] == State::kFailed;
  });
  return state_[peer] == State::kConnected;
}

void Mesh::interrupt() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  interrupted_.store(true, std::memory_order_release);
  if (dialHandle_.valid()) ::shutdown(dialHandle_.get(), SHUT_RDWR);
  changed_.notify_all();
  wakeLocked();
}

void Mesh::markAborted() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  if (dialHandle_.valid()) ::shutdown(dialHandle_.get(), SHUT_RDWR);
  changed_.notify_all();
}

void Mesh::close() noexcept {
  std::vector<std::pair<int, std::unique_ptr<Link>>> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    left.swap(arrived_);
    if (aborted_) return;  // then only the close speaks (Endpoint::abort told what it could)
  }
  // Links nobody will take: the peers must not take this close for a crash.
  FrameHeader bye;
  bye.kind = static_cast<uint8_t>(FrameKind::kGoodbye);
  iovec iov{&bye, sizeof(bye)};
  for (auto& [peer, link] : left) link->writeControl(&iov, 1);
}

auth::VerdictCode Mesh::admit(int from) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return auth::VerdictCode::kDeparted;
  if (aborted_ || interrupted_.load(std::memory_order_relaxed)) return auth::VerdictCode::kAborted;
  State& s = state_.at(from);
  switch (s) {
    case State::kNone:
      break;
    case State::kDialing:
      if (plan_.rank < from) return auth::VerdictCode::kCollision;  // ours wins
      break;
    case State::kFailed:
      return auth::VerdictCode::kAborted;  // this rank's run fails on it; the group aborts
    case State::kAccepting:
    case State::kConnected:
      return auth::VerdictCode::kCollision;
  }
  s = State::kAccepting;
  return auth::VerdictCode::kAccepted;
}

void Mesh::deliver(int from, std::unique_ptr<Link> link) noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  if (closed_ || aborted_ || interrupted_.load(std::memory_order_relaxed)) {
    lock.unlock();
    FrameHeader bye;
    bye.kind = static_cast<uint8_t>(FrameKind::kGoodbye);
    iovec iov{&bye, sizeof(bye)};
    // Gone: a goodbye ("left the group"). Aborted: only the close; the peer then finds this
    // rank's abort record (Note [Root cause] in comm/group.cpp).
    if (closed_ && !aborted_) link->writeControl(&iov, 1);
    link->shutdown();
    return;
  }
  state_.at(from) = State::kConnected;
  try {
    arrived_.emplace_back(from, std::move(link));
  } catch (...) {
    state_.at(from) = State::kFailed;
    failure_.at(from) = std::current_exception();
  }
  arrivalCount_.fetch_add(1, std::memory_order_release);
  changed_.notify_all();
  wakeLocked();
}

void Mesh::failed(int from, std::exception_ptr error) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.at(from) = State::kFailed;
  failure_.at(from) = std::move(error);
  changed_.notify_all();
  wakeLocked();
}

std::vector<std::pair<int, std::unique_ptr<Link>>> Mesh::takeArrivals() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(arrived_, {});
}

void Mesh::throwFailure(int peer) {
  std::rethrow_exception(failure_[peer]);
}

auth::VerdictCode Mesh::attempt(int peer, const Deadline& deadline, std::unique_ptr<Link>* link,
                                const std::function<void()>* slow, Clock::time_point slowAt) {
  const std::string what = fmt::format("rank {} → peer {}", plan_.rank, peer);
  dials_.fetch_add(1);
  Fd sock = connectOnce(plan_.peers[peer].address, deadline, peer, what);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (interrupted_.load(std::memory_order_relaxed) || aborted_) {
      SHOAL_THROW(PeerError, "{}: interrupted while connecting", what);
    }
    // shutdown() of a dup stops the socket itself, and the dup's number cannot be reused
    // under interrupt()'s feet.
    dialHandle_ = Fd(::fcntl(sock.get(), F_DUPFD_CLOEXEC, 0));
  }
  struct Release {
    Mesh& m;
    ~Release() {
      std::lock_guard<std::mutex> lock(m.mutex_);
      m.dialHandle_.reset();
    }
  } release{*this};
  auth::VerdictCode code = auth::VerdictCode::kAccepted;
  try {
    // A stopped peer's kernel still completes the connection: its silence shows here, when the
    // greeting does not come, and the deadline names it. But a peer whose acceptor closed with
    // this connection still unaccepted can leave it open with nobody behind it (seen in CI: a
    // 60 s wait on a peer that had aborted and gone). So when the greeting is late, a second
    // connection asks whether anything still listens there: refused, the peer is gone
    // (ConnectionLost, as when the first connect is refused); else it is closed at once and the
    // wait goes on.
    const Clock::time_point probeAt = slow ? slowAt : Clock::now() + kGreetingProbeAfter;
    const Deadline first(
        std::clamp<Duration>(probeAt - Clock::now(), Duration(0), deadline.remaining()));
    if (!pollFor(sock.get(), POLLIN, first) && !deadline.expired()) {
      if (slow) (*slow)();
      connectOnce(plan_.peers[peer].address, deadline, peer, what);
    }
    auth::connect(sock.get(), plan_.secret, auth::Channel::kData, plan_.groupId, plan_.rank, peer,
                  deadline, what, &code);
    if (code == auth::VerdictCode::kAccepted)
      *link = dialedLink(plan_, peer, std::move(sock), deadline);
  } catch (TimeoutError& e) {
    e.setOrigin(peer);  // the one rank this wait was for
    throw;
  } catch (const Error& e) {
    if (interrupted_.load(std::memory_order_acquire)) {
      SHOAL_THROW(PeerError, "{}: interrupted while connecting ({})", what, e.what());
    }
    // The peer closed while the connection was being made: its process is going away (after an
    // abort, or not), which the caller finds out as for any lost connection (Note [Root cause]
    // in comm/group.cpp).
    if (dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const ConnectionLost*>(&e)) {
      throw ConnectionLost(
          fmt::format("{}: peer {} closed the connection while it was being made ({})", what, peer,
                      e.what()),
          peer);
    }
    throw;
  }
  switch (code) {
    case auth::VerdictCode::kAccepted:
    case auth::VerdictCode::kCollision:
      return code;
    case auth::VerdictCode::kDeparted: {
      PeerError e(fmt::format(
          "{}: peer {} left the group (destroyed it normally) before the two ever talked", what,
          peer));
      e.setOrigin(peer);
      throw e;
    }
    default: {
      ConnectionLost e(
          fmt::format("{}: peer {} aborted the group (it refused the connection)", what, peer),
          peer);
      // The peer said it is aborting: it is where the failure is known, and its account (its
      // abort record) is on its way (Note [Root cause] in comm/native/native_engine.cpp).
      e.setOrigin(peer);
      throw e;
    }
  }
}

std::unique_ptr<Link> Mesh::dial(int peer, const Deadline& deadline,
                                 const std::function<void()>& onSlow, Duration slowAfter) {
  if (plan_.peers.size() != static_cast<size_t>(plan_.size)) {
    SHOAL_THROW(InvalidArgument, "rank {}: no link to peer {}", plan_.rank, peer);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  switch (state_.at(peer)) {
    case State::kConnected:
      return nullptr;
    case State::kFailed:
      throwFailure(peer);
    case State::kNone:
      state_[peer] = State::kDialing;
      break;
    case State::kDialing:
    case State::kAccepting:
      break;  // an earlier dial() was cut short (stopped by its deadline): go on with it
  }
  auto backoff = std::chrono::duration_cast<Duration>(kFirstRedial);
  auto redialAt = Clock::now();  // dial at once
  const auto slowAt = Clock::now() + slowAfter;
  bool slowFired = !onSlow;
  const std::function<void()> slow = [&] {
    if (!slowFired && Clock::now() >= slowAt) {
      slowFired = true;
      onSlow();
    }
  };
  for (;;) {
    if (interrupted_.load(std::memory_order_relaxed)) {
      SHOAL_THROW(PeerError, "rank {} → peer {}: interrupted while connecting", plan_.rank, peer);
    }
    if (state_[peer] == State::kConnected) return nullptr;
    if (state_[peer] == State::kFailed) throwFailure(peer);
    if (state_[peer] == State::kDialing && Clock::now() >= redialAt) {
      lock.unlock();
      std::unique_ptr<Link> link;
      auth::VerdictCode code;
      try {
        code = attempt(peer, deadline, &link, slowFired ? nullptr : &slow, slowAt);
      } catch (const Error& e) {
        lock.lock();
        // The acceptor took over meanwhile: the peer's link counts, whatever became of our
        // dial. A peer that sent and then left (or aborted) answers our late hello so, while
        // its link, holding what it sent and then its goodbye, is ours to read.
        if (state_[peer] == State::kAccepting || state_[peer] == State::kConnected) continue;
        // Otherwise final for the pair (a timeout only ends this call: see kDialing above).
        if (!dynamic_cast<const TimeoutError*>(&e)) {
          state_[peer] = State::kFailed;
          failure_[peer] = std::current_exception();
        }
        throw;
      }
      lock.lock();
      if (code == auth::VerdictCode::kAccepted) {
        // No hello of the peer's can have been accepted here (Note [Simultaneous dial]).
        state_[peer] = State::kConnected;
        changed_.notify_all();
        return link;
      }
      collisions_.fetch_add(1);
      redialAt = Clock::now() + backoff;
      backoff = std::min<Duration>(2 * backoff, kMaxRedial);
      continue;
    }
    if (deadline.expired()) {
      TimeoutError e(fmt::format(
          "rank {} ↔ peer {}: the connection was not made within {:.1f} s (both dialed; "
          "waiting for peer {}'s)",
          plan_.rank, peer, deadline.timeoutSeconds(), peer));
      e.setOrigin(peer);
      throw e;
    }
    auto until =
        state_[peer] == State::kDialing ? std::min(redialAt, deadline.end()) : deadline.end();
    if (!slowFired) until = std::min(until, slowAt);
    changed_.wait_until(lock, until);
    if (!slowFired && Clock::now() >= slowAt) {
      lock.unlock();  // the acceptor may deliver meanwhile
      slow();
      lock.lock();
    }
  }
}

}  // namespace shoal::transport
