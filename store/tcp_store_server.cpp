#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>

#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/log.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {

namespace {

using auth::GreetingStatus;

struct Client {
  Fd fd;
  std::string in;
  std::string out;
  // Until the hello is checked, nothing in `in` is read as a request.
  bool authenticated = false;
  auth::Greeting greeting{};
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

// Reads what the socket has, up to `room` bytes. Returns false when the peer closed or failed.
bool receive(Client& c, size_t room) {
  char buf[64 * 1024];
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

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options)
    : options_(std::move(options)) {
  const auto& o = options_;
  if (o.maxKeyBytes == 0 || o.maxValueBytes == 0 || o.maxStoredBytes == 0 ||
      o.maxConnections <= 0 || o.maxParked <= 0 || o.handshakeTimeout <= Duration(0) ||
      o.idleTimeout <= Duration(0)) {
    SHOAL_THROW(InvalidArgument, "store server on {}:{}: every limit must be positive", host, port);
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
  auto drop = [&](Client& c, const std::string& why) {
    SHOAL_LOG_WARN("store server: dropping a client: {}", why);
    server.forget(c);
    c.fd.reset();
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
      const size_t inBound = size_t{server.maxFrame()} + 4;
      const bool read = c.in.size() < inBound && c.out.size() < server.maxFrame();
      const short ev = static_cast<short>((read ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT));
      fds.push_back({c.fd.get(), ev, 0});
      owners.push_back(&c);
      if (!c.parked) wake = std::min(wake, c.deadline);
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
        c.fd = std::move(conn);
        c.authenticated = o.secret.empty();
        c.greeting = auth::makeGreeting(c.authenticated ? GreetingStatus::kOpen
                                                        : GreetingStatus::kChallenge);
        c.out.assign(reinterpret_cast<const char*>(&c.greeting), sizeof(c.greeting));
        c.deadline = Clock::now() + (c.authenticated ? o.idleTimeout : o.handshakeTimeout);
        clients.push_back(std::move(c));
      }
    }
    bool mutated = false;
    const Clock::time_point after = Clock::now();
    for (size_t i = 0; i < owners.size(); ++i) {
      Client& c = *owners[i];
      const short re = fds[i + 2].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) {
        const size_t before = c.in.size();
        const size_t inBound = size_t{server.maxFrame()} + 4;
        const bool alive = receive(c, inBound - std::min(c.in.size(), inBound));
        if (c.in.size() != before && c.authenticated) c.deadline = after + o.idleTimeout;
        if (!alive) {
          server.forget(c);
          c.fd.reset();
          continue;
        }
      }
      if (!c.authenticated && !c.closing && c.in.size() >= sizeof(auth::Hello)) {
        auth::Hello hello;
        std::memcpy(&hello, c.in.data(), sizeof(hello));
        c.in.erase(0, sizeof(hello));
        std::string why;
        auth::Verdict v =
            auth::checkHello(o.secret, c.greeting, hello, auth::Channel::kStore, &why);
        c.out.append(reinterpret_cast<const char*>(&v), sizeof(v));
        if (v.code == static_cast<uint32_t>(auth::VerdictCode::kAccepted)) {
          c.authenticated = true;
          c.deadline = after + o.idleTimeout;
        } else {
          SHOAL_LOG_WARN("store server: refused a client: {}", why);
          c.closing = true;
          c.in.clear();
        }
      }
      if (c.authenticated && !c.closing) {
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
      if (!c.out.empty()) {
        ssize_t w = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          c.out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          server.forget(c);
          c.fd.reset();
          continue;
        }
      }
      if (c.closing && c.out.empty()) {
        c.fd.reset();
        continue;
      }
      if (!c.parked && after >= c.deadline) {
        drop(c, c.authenticated ? "idle for too long" : "no handshake in time");
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
