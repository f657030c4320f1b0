#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <optional>

#include "common/encryption.h"
#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/log.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {

namespace {

using auth::GreetingStatus;

// Where a connection is in its life: the HMAC hello, the encryption offer, the TLS handshake,
// then requests. Until kReady nothing in `in` is read as a request.
enum class Phase { kHello, kOffer, kTls, kReady };

struct Client {
  Fd fd;
  std::string in;
  std::string out;
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
  // Bytes of an over-limit frame still to discard unread.
  uint64_t skip = 0;
  // The handshake deadline, then the idle deadline (pushed on by every byte received).
  Clock::time_point deadline;
  // A parked get/wait: answered when all keys exist. Requests on one connection are served
  // in order, so while one is parked the client's later requests wait in `in`.
  std::optional<wire::Message> parked;
};

class Server {
 public:
  explicit Server(const TcpStoreServerOptions& o)
      : o_(o),
        maxFrame_(static_cast<uint32_t>(std::min<size_t>(
            wire::kMaxFrame, wire::kFrameHeader + 3 * 4 + o.maxKeyBytes + 2 * o.maxValueBytes))) {}

  uint32_t maxFrame() const { return maxFrame_; }
  size_t storedBytes() const { return stored_; }
  int parkedCount() const { return parked_; }

  // Serves as many queued requests of a client as possible. Throws ProtocolError for a
  // malformed frame (the caller drops the client).
  void drain(Client& c) {
    if (c.parked) {
      if (!handle(c, *c.parked)) return;
      c.parked.reset();
      --parked_;
    }
    // A client that does not read its replies stops being served (and read) until it does.
    while (c.out.size() < maxFrame_) {
      if (c.skip > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(c.skip, c.in.size()));
        c.in.erase(0, n);
        c.skip -= n;
        if (c.skip > 0) return;
      }
      auto len = wire::peekLength(c.in);
      if (len && *len > maxFrame_) {
        // Answer now, then discard the frame as it arrives: the client's write completes and
        // it reads this reply, instead of a reset connection it would retry.
        c.out += wire::encode(
            wire::kFailed,
            {fmt::format("request of {} bytes exceeds the store's limit of {} bytes (keys up to "
                         "{} bytes, values up to {} bytes)",
                         *len, maxFrame_, o_.maxKeyBytes, o_.maxValueBytes)});
        c.in.erase(0, 4);
        c.skip = *len;
        continue;
      }
      auto m = wire::tryDecode(c.in, maxFrame_);
      if (!m) return;
      if (!handle(c, *m)) {
        if (parked_ >= o_.maxParked) {
          fail(c, fmt::format("too many waiting get/wait requests (limit {})", o_.maxParked));
          continue;
        }
        c.parked = std::move(m);
        ++parked_;
        return;
      }
    }
  }

  // The client is going away: forget its parked request.
  void forget(Client& c) {
    if (c.parked) --parked_;
    c.parked.reset();
  }

 private:
  void fail(Client& c, const std::string& why) { c.out += wire::encode(wire::kFailed, {why}); }

  // Checks a key against the limit; false (with a reply) when over.
  bool keyOk(Client& c, const std::string& key) {
    if (key.size() <= o_.maxKeyBytes) return true;
    fail(c, fmt::format("key of {} bytes exceeds the store's limit of {} bytes", key.size(),
                        o_.maxKeyBytes));
    return false;
  }
  bool valueOk(Client& c, const std::string& key, const std::string& value) {
    if (value.size() <= o_.maxValueBytes) return true;
    fail(c, fmt::format("value of {} bytes for key '{}' exceeds the store's limit of {} bytes",
                        value.size(), key.substr(0, 64), o_.maxValueBytes));
    return false;
  }
  // Stores key = value if the total stays within the limit; false (with a reply) otherwise.
  bool put(Client& c, const std::string& key, const std::string& value) {
    auto it = data_.find(key);
    const size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    const size_t now = stored_ - old + key.size() + value.size();
    if (now > o_.maxStoredBytes && now > stored_) {
      fail(c, fmt::format("the store is full ({} of {} bytes used)", stored_, o_.maxStoredBytes));
      return false;
    }
    data_[key] = value;
    stored_ = now;
    return true;
  }

  // Handles one request; returns false if it must park until keys appear.
  bool handle(Client& c, const wire::Message& m) {
    auto reply = [&](uint8_t status, std::vector<std::string> fields) {
      c.out += wire::encode(status, fields);
    };
    auto need = [&](size_t n) {
      if (m.fields.size() != n) {
        SHOAL_THROW(ProtocolError, "store command {} with {} fields, expected {}", m.code,
                    m.fields.size(), n);
      }
    };
    switch (m.code) {
      case wire::kSet:
        need(2);
        if (keyOk(c, m.fields[0]) && valueOk(c, m.fields[0], m.fields[1]) &&
            put(c, m.fields[0], m.fields[1])) {
          reply(wire::kOk, {});
        }
        return true;
      case wire::kGet: {
        need(1);
        if (!keyOk(c, m.fields[0])) return true;
        auto it = data_.find(m.fields[0]);
        if (it == data_.end()) return false;
        reply(wire::kOk, {it->second});
        return true;
      }
      case wire::kAdd: {
        need(2);
        if (!keyOk(c, m.fields[0])) return true;
        try {
          auto it = data_.find(m.fields[0]);
          int64_t v = (it == data_.end() ? 0 : parseCounter(m.fields[0], it->second)) +
                      parseCounter("delta", m.fields[1]);
          if (put(c, m.fields[0], std::to_string(v))) reply(wire::kOk, {std::to_string(v)});
        } catch (const StoreError& e) {
          reply(wire::kFailed, {e.what()});
        }
        return true;
      }
      case wire::kCompareSet: {
        need(3);
        if (!keyOk(c, m.fields[0]) || !valueOk(c, m.fields[0], m.fields[2])) return true;
        auto it = data_.find(m.fields[0]);
        std::string current = it == data_.end() ? std::string() : it->second;
        if (current == m.fields[1]) {
          if (!put(c, m.fields[0], m.fields[2])) return true;
          current = m.fields[2];
        }
        reply(wire::kOk, {current});
        return true;
      }
      case wire::kWait:
      case wire::kCheck: {
        for (const auto& k : m.fields) {
          if (!keyOk(c, k)) return true;
        }
        bool all = true;
        for (const auto& k : m.fields) all = all && data_.count(k) > 0;
        if (m.code == wire::kCheck) {
          reply(wire::kOk, {all ? "1" : "0"});
          return true;
        }
        if (!all) return false;
        reply(wire::kOk, {});
        return true;
      }
      case wire::kDelete: {
        need(1);
        auto it = data_.find(m.fields[0]);
        if (it != data_.end()) {
          stored_ -= it->first.size() + it->second.size();
          data_.erase(it);
        }
        reply(wire::kOk, {it != data_.end() ? "1" : "0"});
        return true;
      }
    }
    SHOAL_THROW(ProtocolError, "unknown store command {}", m.code);
  }

  const TcpStoreServerOptions& o_;
  const uint32_t maxFrame_;
  std::map<std::string, std::string> data_;
  size_t stored_ = 0;
  int parked_ = 0;
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
  Server server(o);
  std::list<Client> clients;
  std::vector<pollfd> fds;
  std::vector<Client*> owners;
  // Out of descriptors (EMFILE): stop polling the listener for a moment instead of spinning.
  Clock::time_point acceptPausedUntil{};
  auto release = [&](Client& c) {
    server.forget(c);
    c.tls.reset();
    c.fd.reset();
  };
  auto drop = [&](Client& c, const std::string& why) {
    SHOAL_LOG_WARN("store server: dropping a client: {}", why);
    release(c);
  };
  const size_t inBound = size_t{server.maxFrame()} + 4;
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
        return c.out.size() < server.maxFrame() ? inBound - std::min(c.in.size(), inBound) : 0;
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
          server.forget(c);
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
          server.drain(c);
          // Published before the reply leaves, so a client that saw the reply sees the count.
          storedBytes_.store(server.storedBytes());
          mutated = mutated || c.out.size() != before;
        } catch (const Error& e) {
          drop(c, e.what());
          continue;
        }
      }
      if (!flush(c)) {
        server.forget(c);
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
          server.drain(c);
          if (!c.parked) c.deadline = Clock::now() + o.idleTimeout;
        } catch (const Error& e) {
          drop(c, e.what());
        }
      }
      clients.remove_if([](const Client& c) { return !c.fd.valid(); });
    }
    connections_.store(static_cast<int>(clients.size()));
    storedBytes_.store(server.storedBytes());
  }
}

}  // namespace shoal::store
