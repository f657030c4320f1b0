#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>

#include "common/encryption.h"
#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/log.h"
#include "store/tcp_store.h"
#include "store/tcp_store_requests.h"

namespace shoal::store {

namespace {

using auth::GreetingStatus;

// Where a connection is in its life: the HMAC hello, the encryption offer, the TLS handshake,
// then requests. Until kReady nothing in `in` is read as a request.
enum class Phase { kHello, kOffer, kTls, kReady };

// A connection: its handshake, then its requests (RequestStream's `in` and `out` carry the
// handshake's bytes too).
struct Client : RequestStream {
  Fd fd;
  Phase phase = Phase::kHello;
  auth::Greeting greeting{};
  // Encrypted connections, from the TLS handshake on (phase kTls, kReady).
  std::unique_ptr<tls::Session> tls;
  // The last TLS call needs the socket writable before it can go on.
  bool tlsWantsWrite = false;
  // Not both ends on loopback: auto encrypts it.
  bool crossesHosts = true;
  bool authenticated() const { return phase == Phase::kReady; }
  // Close once `out` is flushed (after a refusal).
  bool closing = false;
  // The handshake deadline, then the idle deadline (pushed on by every byte received).
  Clock::time_point deadline;
};

// One TLS read or write on an encrypted client: its result (a read or write that must wait
// says which way in tlsWantsWrite), or nothing when the client is to be dropped (it closed, or
// TLS failed).
template <typename Io>
std::optional<tls::Session::Result> tlsCall(Client& c, const Io& io) {
  tls::Session::Result r;
  try {
    r = io();
  } catch (const Error& e) {
    SHOAL_LOG_WARN("store server: dropping a client: {}", e.what());
    return std::nullopt;
  }
  if (r.status == tls::Session::Status::kClosed) return std::nullopt;
  if (r.status != tls::Session::Status::kOk) {
    c.tlsWantsWrite = r.status == tls::Session::Status::kWantWrite;
  }
  return r;
}

// Reads what the connection has (decrypted when it is encrypted), up to `room` bytes. Returns
// false when the peer closed or failed (a TLS error included: the client is dropped).
bool receive(Client& c, size_t room) {
  char buf[64 * 1024];
  while (c.tls && room > 0) {
    auto r = tlsCall(c, [&] { return c.tls->read(buf, std::min(room, sizeof(buf))); });
    if (!r) return false;
    if (r->status != tls::Session::Status::kOk) return true;
    c.in.append(buf, r->bytes);
    room -= r->bytes;
  }
  while (room > 0) {
    ssize_t r = ::recv(c.fd.get(), buf, std::min(room, sizeof(buf)), 0);
    if (r > 0) {
      c.in.append(buf, static_cast<size_t>(r));
      room -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return true;
}

// Sends what the connection can take of `out`. Returns false when the peer is gone.
bool flush(Client& c) {
  if (c.out.empty()) return true;
  if (!c.tls) {
    ssize_t w = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (w > 0) c.out.erase(0, static_cast<size_t>(w));
    return w >= 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
  c.tlsWantsWrite = false;
  while (!c.out.empty()) {
    // `out` keeps its front until it is reported written: a retry offers the same bytes
    // (Note [TLS write retry] in common/tls.h).
    auto r = tlsCall(
        c, [&] { return c.tls->write(c.out.data(), std::min(c.out.size(), tls::kMaxRecord)); });
    if (!r) return false;
    if (r->status != tls::Session::Status::kOk) return true;
    c.out.erase(0, r->bytes);
  }
  return true;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options)
    : options_(std::move(options)) {
  const auto& o = options_;
  if (o.maxKeyBytes == 0 || o.maxValueBytes == 0 || o.maxStoredBytes == 0 ||
      o.maxConnections <= 0 || o.maxParked <= 0 || o.handshakeTimeout <= Duration(0) ||
      o.idleTimeout <= Duration(0)) {
    SHOAL_THROW(InvalidArgument, "store server on {}:{}: every limit must be positive", host, port);
  }
  if (o.encrypt == EncryptMode::kOn && o.secret.empty()) {
    SHOAL_THROW(InvalidArgument,
                "store server on {}:{}: SHOAL_ENCRYPT=on needs a job secret to key TLS with (set "
                "SHOAL_SECRET)",
                host, port);
  }
  listen_ = listenTcp(host, port, &port_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) throwSystemError("pipe", errno);
  wakeRead_ = Fd(fds[0]);
  wakeWrite_ = Fd(fds[1]);
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  char b = 1;
  ssize_t ignored = ::write(wakeWrite_.get(), &b, 1);
  (void)ignored;
  thread_.join();
}

// One thread, one poll loop: every client is a small state machine (handshake → requests), so
// a client that stalls anywhere costs a slot until its deadline, never the others' progress.
void TcpStoreServer::serve() {
  const TcpStoreServerOptions& o = options_;
  StoreRequests requests(o);
  std::list<Client> clients;
  std::vector<pollfd> fds;
  std::vector<Client*> owners;
  // Out of descriptors (EMFILE): stop polling the listener for a moment instead of spinning.
  Clock::time_point acceptPausedUntil{};
  auto release = [&](Client& c) {
    requests.forget(c);
    c.tls.reset();
    c.fd.reset();
  };
  auto drop = [&](Client& c, const std::string& why) {
    SHOAL_LOG_WARN("store server: dropping a client: {}", why);
    release(c);
  };
  const size_t inBound = size_t{requests.maxFrame()} + 4;
  // How many bytes to read from a client now. Before requests, exactly what the handshake still
  // needs: the bytes after them belong to TLS when the connection is encrypted.
  auto room = [&](const Client& c) -> size_t {
    if (c.closing) return 0;
    switch (c.phase) {
      case Phase::kHello:
        return sizeof(auth::Hello) - std::min(c.in.size(), sizeof(auth::Hello));
      case Phase::kOffer:
        return sizeof(encryption::Offer) - std::min(c.in.size(), sizeof(encryption::Offer));
      case Phase::kTls:
        return 0;  // the session reads for itself
      case Phase::kReady:
        return c.out.size() < requests.maxFrame() ? inBound - std::min(c.in.size(), inBound) : 0;
    }
    return 0;
  };
  for (;;) {
    const Clock::time_point now = Clock::now();
    fds.clear();
    owners.clear();
    fds.push_back({wakeRead_.get(), POLLIN, 0});
    const bool accepting = now >= acceptPausedUntil;
    fds.push_back({listen_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    Clock::time_point wake = accepting ? Clock::time_point::max() : acceptPausedUntil;
    for (auto& c : clients) {
      // Stop reading a client whose input or output is at its bound (flow control).
      const bool read = room(c) > 0 || (c.phase == Phase::kTls && c.tls);
      const bool write = !c.out.empty() || c.tlsWantsWrite;
      const short ev = static_cast<short>((read ? POLLIN : 0) | (write ? POLLOUT : 0));
      fds.push_back({c.fd.get(), ev, 0});
      owners.push_back(&c);
      if (!c.parked) wake = std::min(wake, c.deadline);
      // Decrypted bytes the socket will not announce again: come back at once for them.
      if (read && c.tls && c.tls->buffered()) wake = now;
    }
    int timeoutMs = -1;
    if (wake != Clock::time_point::max()) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      timeoutMs = static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
    }
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0) {
      if (errno == EINTR) continue;
      SHOAL_LOG_WARN("store server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            SHOAL_LOG_WARN("store server: cannot accept: {}", std::strerror(errno));
            acceptPausedUntil = Clock::now() + std::chrono::milliseconds(100);
          }
          break;
        }
        Fd conn(fd);
        if (static_cast<int>(clients.size()) >= o.maxConnections) {
          // Said before the client sends anything, so closing loses nothing it could read.
          auto busy = auth::makeGreeting(GreetingStatus::kBusy);
          ssize_t ignored = ::send(conn.get(), &busy, sizeof(busy), MSG_NOSIGNAL);
          (void)ignored;
          continue;
        }
        setNoDelay(conn.get());
        Client c;
        c.crossesHosts = !isLoopbackConnection(conn.get());
        c.fd = std::move(conn);
        c.phase = o.secret.empty() ? Phase::kReady : Phase::kHello;
        c.greeting = auth::makeGreeting(c.authenticated() ? GreetingStatus::kOpen
                                                          : GreetingStatus::kChallenge);
        c.out.assign(reinterpret_cast<const char*>(&c.greeting), sizeof(c.greeting));
        c.deadline = Clock::now() + (c.authenticated() ? o.idleTimeout : o.handshakeTimeout);
        clients.push_back(std::move(c));
      }
    }
    bool mutated = false;
    const Clock::time_point after = Clock::now();
    for (size_t i = 0; i < owners.size(); ++i) {
      Client& c = *owners[i];
      const short re = fds[i + 2].revents;
      const bool tlsBuffered = c.tls && c.phase == Phase::kReady && c.tls->buffered();
      if ((re & (POLLIN | POLLHUP | POLLERR)) || tlsBuffered) {
        const size_t want = room(c);
        const size_t before = c.in.size();
        bool alive = true;
        if (want > 0) {
          alive = receive(c, want);
        } else if (c.phase != Phase::kTls && (re & (POLLHUP | POLLERR))) {
          alive = false;  // not reading it, and it is gone
        }
        if (c.in.size() != before && c.authenticated()) c.deadline = after + o.idleTimeout;
        if (!alive) {
          requests.forget(c);
          c.tls.reset();
          c.fd.reset();
          continue;
        }
      }
      if (c.phase == Phase::kHello && !c.closing && c.in.size() >= sizeof(auth::Hello)) {
        auth::Hello hello;
        std::memcpy(&hello, c.in.data(), sizeof(hello));
        c.in.erase(0, sizeof(hello));
        std::string why;
        auth::Verdict v =
            auth::checkHello(o.secret, c.greeting, hello, auth::Channel::kStore, &why);
        c.out.append(reinterpret_cast<const char*>(&v), sizeof(v));
        if (v.code == static_cast<uint32_t>(auth::VerdictCode::kAccepted)) {
          // Then both ends offer (common/encryption.h), still within the handshake deadline.
          const auto offer = encryption::makeOffer(o.encrypt, c.crossesHosts);
          c.out.append(reinterpret_cast<const char*>(&offer), sizeof(offer));
          c.phase = Phase::kOffer;
        } else {
          SHOAL_LOG_WARN("store server: refused a client: {}", why);
          c.closing = true;
          c.in.clear();
        }
      }
      if (c.phase == Phase::kOffer && !c.closing && c.in.size() >= sizeof(encryption::Offer)) {
        encryption::Offer theirs;
        std::memcpy(&theirs, c.in.data(), sizeof(theirs));
        c.in.erase(0, sizeof(theirs));
        std::string why;
        const auto encrypt =
            encryption::decide(encryption::makeOffer(o.encrypt, c.crossesHosts), theirs, &why);
        if (!encrypt) {
          // The client read our offer and reports the same conflict on its side.
          SHOAL_LOG_WARN("store server: refused a client: {}", why);
          c.closing = true;
        } else if (*encrypt) {
          c.phase = Phase::kTls;  // once our clear bytes are out (below)
        } else {
          c.phase = Phase::kReady;
          c.deadline = after + o.idleTimeout;
        }
      }
      if (c.authenticated() && !c.closing) {
        try {
          const size_t before = c.out.size();
          requests.drain(c);
          // Published before the reply leaves, so a client that saw the reply sees the count.
          storedBytes_.store(requests.storedBytes());
          mutated = mutated || c.out.size() != before;
        } catch (const Error& e) {
          drop(c, e.what());
          continue;
        }
      }
      if (!flush(c)) {
        requests.forget(c);
        c.tls.reset();
        c.fd.reset();
        continue;
      }
      if (c.phase == Phase::kTls && c.out.empty()) {
        // Our greeting, verdict and offer went out in clear; from here on only TLS records.
        // Non-blocking steps, one per wake-up: a slow client costs its slot until the handshake
        // deadline, never the others' time.
        try {
          if (!c.tls) {
            c.tls = std::make_unique<tls::Session>(c.fd.get(), tls::Session::Role::kServer,
                                                   encryption::derivePsk(o.secret, "store"),
                                                   "store server ← client");
          }
          const auto st = c.tls->handshakeStep();
          c.tlsWantsWrite = st == tls::Session::Status::kWantWrite;
          if (st == tls::Session::Status::kOk) {
            c.phase = Phase::kReady;
            c.deadline = after + o.idleTimeout;
          }
        } catch (const Error& e) {
          drop(c, e.what());
          continue;
        }
      }
      if (c.closing && c.out.empty()) {
        c.fd.reset();
        continue;
      }
      if (!c.parked && after >= c.deadline) {
        if (c.authenticated()) {
          // Housekeeping, not a fault: a job's clients keep pooled connections they may never
          // use again (a training job talks to the store at start-up and on rare events).
          SHOAL_LOG_DEBUG("store server: closing a client connection idle for {} s",
                          std::chrono::duration_cast<std::chrono::seconds>(o.idleTimeout).count());
          release(c);
        } else {
          drop(c, "no handshake in time");
        }
      }
    }
    // Clients accepted this round were not polled yet; their greeting goes out next round.
    clients.remove_if([](const Client& c) { return !c.fd.valid(); });
    // Any answered request may have been a write that a parked get/wait was waiting for.
    if (mutated) {
      for (auto& c : clients) {
        if (!c.parked) continue;
        try {
          requests.drain(c);
          if (!c.parked) c.deadline = Clock::now() + o.idleTimeout;
        } catch (const Error& e) {
          drop(c, e.what());
        }
      }
      clients.remove_if([](const Client& c) { return !c.fd.valid(); });
    }
    connections_.store(static_cast<int>(clients.size()));
    storedBytes_.store(requests.storedBytes());
  }
}

}  // namespace shoal::store
