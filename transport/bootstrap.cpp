#include "transport/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "transport/auth.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/link_security.h"

namespace shoal::transport {

namespace {

// Incoming connections in their handshake at once; beyond it the rest wait in the backlog.
constexpr size_t kMaxPendingHandshakes = 256;

// A decimal field of a store record (records come from the network: checked, never trusted).
int parseField(const std::string& record, const std::string& text, int peer) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < -1 || v > (1L << 30)) {
    SHOAL_THROW(ProtocolError, "malformed address record '{}' for rank {} in the store", record,
                peer);
  }
  return static_cast<int>(v);
}

struct PeerInfo {
  HostPort address;
  std::string host;
  pid_t pid = 0;
  int bellFd = -1;
};

std::string encodeInfo(const PeerInfo& p) {
  return fmt::format("{}|{}|{}|{}", p.address.str(), p.pid, p.bellFd, p.host);
}

PeerInfo decodeInfo(const std::string& s, int peer) {
  // host may itself contain '|' never; split on the first three bars.
  PeerInfo p;
  size_t a = s.find('|'), b = s.find('|', a + 1), c = s.find('|', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) {
    SHOAL_THROW(ProtocolError, "malformed address record '{}' for rank {} in the store", s, peer);
  }
  p.address = parseHostPort(s.substr(0, a));
  p.pid = parseField(s, s.substr(a + 1, b - a - 1), peer);
  p.bellFd = parseField(s, s.substr(b + 1, c - b - 1), peer);
  p.host = s.substr(c + 1);
  return p;
}

#pragma pack(push, 1)
struct ShmOffer {
  int32_t pid;
  int32_t fd;
  uint64_t capacity;
};
#pragma pack(pop)

}  // namespace

std::unique_ptr<Endpoint> bootstrapEndpoint(const BootstrapOptions& o) {
  const int rank = o.rank, size = o.size;
  std::vector<std::unique_ptr<Link>> links(static_cast<size_t>(size));
  if (size == 1)
    return std::make_unique<Endpoint>(rank, size, std::move(links), nullptr, o.endpoint);

  Deadline deadline(o.timeout);
  int port = 0;
  Fd listener = listenTcp(o.listenAddress, 0, &port);
  std::shared_ptr<shm::Segment> bell;
  if (o.transport != TransportKind::kTcp) {
    bell = shm::Segment::create(sizeof(shm::DoorbellWord), "shoal-doorbell");
  }
  PeerInfo self{{o.listenAddress, port}, shm::hostIdentity(), ::getpid(), bell ? bell->fd() : -1};
  o.store->set(fmt::format("peer/{}", rank), encodeInfo(self));

  std::vector<PeerInfo> peers(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    try {
      peers[p] = decodeInfo(o.store->get(fmt::format("peer/{}", p), deadline.remaining()), p);
    } catch (const TimeoutError&) {
      SHOAL_THROW(TimeoutError, "rank {}: rank {} did not join the group within {:.1f} s", rank, p,
                  deadline.timeoutSeconds());
    }
  }

  auto useShm = [&](int p) {
    bool sameHost = peers[p].host == self.host;
    if (o.transport == TransportKind::kShm && !sameHost) {
      SHOAL_THROW(InvalidArgument,
                  "rank {}: transport shm was forced but rank {} is on another "
                  "host ({})",
                  rank, p, peers[p].host);
    }
    return bell != nullptr && sameHost && peers[p].bellFd >= 0;
  };
  // Note [Segments before completion]: a peer's segments (pair ring, doorbell) are opened
  // through /proc/<pid>/fd while the peer still holds them, i.e. before the peer can finish
  // create() and perhaps destroy the group again: the connector opens the acceptor's doorbell
  // before its ack, and the acceptor opens the connector's before its final "ready" byte.
  auto openBell = [&](int p) {
    return shm::Segment::open(peers[p].pid, peers[p].bellFd, sizeof(shm::DoorbellWord));
  };
  auto makeLink = [&](int p, Fd sock, std::shared_ptr<shm::Segment> seg, size_t cap,
                      std::shared_ptr<shm::Segment> peerBell) {
    LinkContext ctx{rank, p};
    if (!seg) {
      // Encryption is agreed (and TLS set up) here, on the authenticated socket.
      tcp::LinkSecurity security{o.encrypt, &o.secret, o.groupId, p < rank,
                                 peers[p].host != self.host};
      links[p] = tcp::secureTcpLink(ctx, std::move(sock), security, deadline);
      return;
    }
    links[p] = std::make_unique<shm::ShmLink>(ctx, std::move(sock), std::move(seg), cap,
                                              std::move(peerBell));
  };

  // Lower ranks first: they are accepting by the time we connect (they connected to their own
  // lower ranks before), so the chain never waits on itself.
  for (int p = 0; p < rank; ++p) {
    std::string what = fmt::format("rank {} → peer {}", rank, p);
    Fd sock = connectTcp(peers[p].address, deadline, what);
    authenticateConnector(sock.get(), o.secret, o.groupId, rank, p, deadline);
    std::shared_ptr<shm::Segment> seg, peerBell;
    size_t cap = 0;
    if (useShm(p)) {
      // The lower rank created the pair segment and offers it.
      ShmOffer offer{};
      readAll(sock.get(), &offer, sizeof(offer), deadline, what + ": shared-memory offer");
      if (offer.capacity < 4096 || offer.capacity > (1ull << 32) || offer.pid != peers[p].pid) {
        SHOAL_THROW(ProtocolError, "{}: invalid shared-memory offer (pid {}, {} bytes)", what,
                    offer.pid, offer.capacity);
      }
      cap = offer.capacity;
      seg = shm::Segment::open(offer.pid, offer.fd, shm::ShmLink::segmentBytes(cap));
      peerBell = openBell(p);  // Note [Segments before completion]
      char ack = 1;
      writeAll(sock.get(), &ack, 1, deadline, what);
      char ready = 0;
      readAll(sock.get(), &ready, 1, deadline, what + ": shared-memory ready");
    }
    makeLink(p, std::move(sock), std::move(seg), cap, std::move(peerBell));
  }

  // Accept the higher ranks. Every incoming connection gets the greeting at once and its own
  // short handshake deadline, and all of them progress together in one poll loop: a port
  // scanner, a health check or a rogue that sends nothing or garbage costs one slot for at most
  // handshakeTimeout, never the real peers' time.
  struct Pending {
    Fd fd;
    auth::Greeting greeting;
    std::string in;
    Clock::time_point deadline;
  };
  std::list<Pending> pending;
  int expected = size - 1 - rank;
  std::vector<pollfd> fds;
  std::vector<Pending*> owners;
  auto missing = [&] {
    std::string out;
    for (int p = rank + 1; p < size; ++p) {
      if (!links[p]) out += (out.empty() ? "" : ", ") + std::to_string(p);
    }
    return out;
  };
  while (expected > 0) {
    if (deadline.expired()) {
      SHOAL_THROW(TimeoutError,
                  "rank {}: rank(s) {} did not connect within {:.1f} s ({} unauthenticated "
                  "connection(s) pending)",
                  rank, missing(), deadline.timeoutSeconds(), pending.size());
    }
    fds.clear();
    owners.clear();
    const bool accepting = pending.size() < kMaxPendingHandshakes;
    fds.push_back({listener.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    Clock::time_point wake = deadline.end();
    for (auto& h : pending) {
      fds.push_back({h.fd.get(), POLLIN, 0});
      owners.push_back(&h);
      wake = std::min(wake, h.deadline);
    }
    const auto waitMs = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    if (::poll(fds.data(), fds.size(),
               static_cast<int>(std::clamp<long long>(waitMs, 0, 1 << 30))) < 0) {
      if (errno == EINTR) continue;
      throwSystemError("poll", errno);
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < owners.size(); ++i) {
      Pending& h = *owners[i];
      if (fds[i + 1].revents == 0) {
        if (now >= h.deadline) {
          SHOAL_LOG_WARN("rank {}: closed a connection that sent no handshake within {:.1f} s",
                         rank, std::chrono::duration<double>(o.handshakeTimeout).count());
          h.fd.reset();
        }
        continue;
      }
      char buf[sizeof(auth::Hello)];
      ssize_t r = ::recv(h.fd.get(), buf, sizeof(auth::Hello) - h.in.size(), 0);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        SHOAL_LOG_DEBUG("rank {}: an incoming connection closed before its handshake", rank);
        h.fd.reset();
        continue;
      }
      h.in.append(buf, static_cast<size_t>(r));
      if (h.in.size() < sizeof(auth::Hello)) continue;
      auth::Hello hello;
      std::memcpy(&hello, h.in.data(), sizeof(hello));
      int p = -1;
      std::string why;
      auth::Verdict v =
          checkDataHello(o.secret, h.greeting, hello, o.groupId, rank, size, &p, &why);
      const bool accepted = v.code == static_cast<uint32_t>(auth::VerdictCode::kAccepted);
      if (accepted && links[p]) {
        // A valid proof cannot be replayed (fresh nonce), so this is a confused real rank.
        why = fmt::format("rank {} connected twice", p);
        v = auth::refuse(auth::VerdictCode::kWrongPeer);
      }
      Fd sock = std::move(h.fd);
      try {
        // 40 bytes into an idle socket's buffer: does not block in practice, bounded anyway.
        writeAll(sock.get(), &v, sizeof(v),
                 Deadline(std::min(deadline.remaining(), o.handshakeTimeout)),
                 fmt::format("rank {}: handshake with an incoming connection", rank));
      } catch (const Error& e) {
        SHOAL_LOG_WARN("rank {}: rejected a connection: {}", rank, e.what());
        continue;
      }
      if (v.code != static_cast<uint32_t>(auth::VerdictCode::kAccepted)) {
        SHOAL_LOG_WARN("rank {}: rejected a connection: {}", rank, why);
        continue;
      }
      // From here on the connector proved the secret: it is a rank of this job.
      std::string what = fmt::format("rank {} ← peer {}", rank, p);
      std::shared_ptr<shm::Segment> seg, peerBell;
      size_t cap = o.shmRingBytes;
      if (useShm(p)) {
        seg = shm::Segment::create(shm::ShmLink::segmentBytes(cap),
                                   fmt::format("shoal-pair-{}-{}", rank, p));
        ShmOffer offer{static_cast<int32_t>(::getpid()), seg->fd(), cap};
        writeAll(sock.get(), &offer, sizeof(offer), deadline, what);
        char ack = 0;
        readAll(sock.get(), &ack, 1, deadline, what + ": shared-memory ack");
        peerBell = openBell(p);  // Note [Segments before completion]
        char ready = 1;
        writeAll(sock.get(), &ready, 1, deadline, what);
      }
      makeLink(p, std::move(sock), std::move(seg), cap, std::move(peerBell));
      --expected;
    }
    pending.remove_if([](const Pending& h) { return !h.fd.valid(); });
    if (fds[0].revents & POLLIN) {
      while (pending.size() < kMaxPendingHandshakes) {
        int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            throwSystemError(fmt::format("rank {}: accept", rank), errno);
          }
          break;
        }
        Pending h{Fd(fd),
                  auth::makeGreeting(auth::GreetingStatus::kChallenge),
                  {},
                  Clock::now() + o.handshakeTimeout};
        setNoDelay(h.fd.get());
        // The greeting fits any fresh socket's send buffer; a peer that resets is just closed.
        if (::send(h.fd.get(), &h.greeting, sizeof(h.greeting), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(sizeof(h.greeting))) {
          continue;
        }
        pending.push_back(std::move(h));
      }
    }
  }

  for (int p = 0; p < size; ++p) {
    if (p != rank) {
      SHOAL_LOG_DEBUG("rank {} ↔ peer {}: {}", rank, p, toString(links[p]->kind()));
    }
  }
  return std::make_unique<Endpoint>(rank, size, std::move(links), bell, o.endpoint);
}

}  // namespace shoal::transport
