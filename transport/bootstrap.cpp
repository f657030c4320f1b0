#include "transport/bootstrap.h"

#include <unistd.h>

#include <map>

#include "common/error.h"
#include "common/log.h"
#include "transport/auth.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/tcp_link.h"

namespace shoal::transport {

namespace {

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
  p.pid = std::stoi(s.substr(a + 1, b - a - 1));
  p.bellFd = std::stoi(s.substr(b + 1, c - b - 1));
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
  auto makeLink = [&](int p, Fd sock, std::shared_ptr<shm::Segment> seg, size_t cap) {
    LinkContext ctx{rank, p};
    if (!seg) {
      links[p] = std::make_unique<tcp::TcpLink>(ctx, std::move(sock));
      return;
    }
    auto peerBell = shm::Segment::open(peers[p].pid, peers[p].bellFd, sizeof(shm::DoorbellWord));
    links[p] = std::make_unique<shm::ShmLink>(ctx, std::move(sock), std::move(seg), cap,
                                              std::move(peerBell));
  };

  // Lower ranks first: they are accepting by the time we connect (they connected to their own
  // lower ranks before), so the chain never waits on itself.
  for (int p = 0; p < rank; ++p) {
    std::string what = fmt::format("rank {} → peer {}", rank, p);
    Fd sock = connectTcp(peers[p].address, deadline, what);
    authenticateConnector(sock.get(), o.secret, o.groupId, rank, p, deadline);
    std::shared_ptr<shm::Segment> seg;
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
      char ack = 1;
      writeAll(sock.get(), &ack, 1, deadline, what);
    }
    makeLink(p, std::move(sock), std::move(seg), cap);
  }

  int expected = size - 1 - rank;
  while (expected > 0) {
    Fd sock =
        acceptTcp(listener.get(), deadline,
                  fmt::format("rank {}: waiting for {} higher rank(s) to connect", rank, expected));
    int p;
    try {
      // A stalled or hostile client must not hold the whole bootstrap.
      Deadline handshake(std::min<Duration>(deadline.remaining(), std::chrono::seconds(10)));
      p = authenticateAcceptor(sock.get(), o.secret, o.groupId, rank, size, handshake);
      if (links[p]) SHOAL_THROW(ProtocolError, "rank {} connected twice", p);
    } catch (const Error& e) {
      SHOAL_LOG_WARN("rank {}: rejected a connection: {}", rank, e.what());
      continue;
    }
    std::string what = fmt::format("rank {} ← peer {}", rank, p);
    std::shared_ptr<shm::Segment> seg;
    size_t cap = o.shmRingBytes;
    if (useShm(p)) {
      seg = shm::Segment::create(shm::ShmLink::segmentBytes(cap),
                                 fmt::format("shoal-pair-{}-{}", rank, p));
      ShmOffer offer{static_cast<int32_t>(::getpid()), seg->fd(), cap};
      writeAll(sock.get(), &offer, sizeof(offer), deadline, what);
      char ack = 0;
      readAll(sock.get(), &ack, 1, deadline, what + ": shared-memory ack");
    }
    makeLink(p, std::move(sock), std::move(seg), cap);
    --expected;
  }

  for (int p = 0; p < size; ++p) {
    if (p != rank) {
      SHOAL_LOG_DEBUG("rank {} ↔ peer {}: {}", rank, p, toString(links[p]->kind()));
    }
  }
  return std::make_unique<Endpoint>(rank, size, std::move(links), bell, o.endpoint);
}

}  // namespace shoal::transport
