#include "transport/link_setup.h"

#include <cerrno>
#include <cstdlib>

#include "common/error.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/shm_link.h"
#include "transport/tcp/link_security.h"

namespace shoal::transport {

namespace {

// A decimal field of a store record.
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

#pragma pack(push, 1)
struct ShmOffer {
  int32_t pid;
  int32_t fd;
  uint64_t capacity;
};
#pragma pack(pop)

bool crossesHosts(const LinkPlan& plan, int peer) {
  return plan.peers[peer].host != plan.self.host;
}

std::unique_ptr<Link> tcpLink(const LinkPlan& plan, int peer, Fd socket, bool dialed,
                              const Deadline& deadline) {
  tcp::LinkSecurity security{plan.encrypt, &plan.secret, plan.groupId, dialed,
                             crossesHosts(plan, peer)};
  return tcp::secureTcpLink({plan.rank, peer}, std::move(socket), security, deadline);
}

// Note [Segments before completion]: a peer's segments (pair ring, doorbell) are opened
// through /proc/<pid>/fd while the peer still holds them, i.e. while it is inside this very
// set-up: the dialing end opens the acceptor's doorbell before its ack, and the accepting end
// opens the dialer's before its final "ready" byte. (Both ends keep their doorbell as long as
// their group exists, and the dialer's group exists while it dials.)
std::shared_ptr<shm::Segment> openBell(const LinkPlan& plan, int peer) {
  return shm::Segment::open(plan.peers[peer].pid, plan.peers[peer].bellFd,
                            sizeof(shm::DoorbellWord));
}

}  // namespace

std::string encodeRecord(const PeerRecord& p) {
  return fmt::format("{}|{}|{}|{}", p.address.str(), p.pid, p.bellFd, p.host);
}

PeerRecord decodeRecord(const std::string& s, int peer) {
  // The host identity comes last and never holds a '|': split on the first three bars.
  PeerRecord p;
  size_t a = s.find('|');
  size_t b = a == std::string::npos ? a : s.find('|', a + 1);
  size_t c = b == std::string::npos ? b : s.find('|', b + 1);
  if (c == std::string::npos) {
    SHOAL_THROW(ProtocolError, "malformed address record '{}' for rank {} in the store", s, peer);
  }
  p.address = parseHostPort(s.substr(0, a));
  p.pid = parseField(s, s.substr(a + 1, b - a - 1), peer);
  p.bellFd = parseField(s, s.substr(b + 1, c - b - 1), peer);
  p.host = s.substr(c + 1);
  return p;
}

void planLinks(LinkPlan& plan, TransportKind transport) {
  plan.kinds.assign(static_cast<size_t>(plan.size), LinkKind::kTcp);
  for (int p = 0; p < plan.size; ++p) {
    if (p == plan.rank) continue;
    const bool cross = crossesHosts(plan, p);
    if (transport == TransportKind::kShm && cross) {
      SHOAL_THROW(InvalidArgument,
                  "rank {}: transport shm was forced but rank {} is on another host ({})",
                  plan.rank, p, plan.peers[p].host);
    }
    if (plan.bell && !cross && plan.peers[p].bellFd >= 0) {
      plan.kinds[p] = LinkKind::kShm;
      continue;
    }
    // Both ends hold the same mode (one job) and see the same host identities, so the
    // agreement made at set-up (common/encryption.h) comes out as decided here.
    const encryption::Offer offer = encryption::makeOffer(plan.encrypt, cross);
    std::string why;
    plan.kinds[p] =
        encryption::decide(offer, offer, &why).value_or(false) ? LinkKind::kTls : LinkKind::kTcp;
  }
}

std::unique_ptr<Link> dialedLink(const LinkPlan& plan, int peer, Fd sock,
                                 const Deadline& deadline) {
  if (plan.kinds[peer] != LinkKind::kShm)
    return tcpLink(plan, peer, std::move(sock), true, deadline);
  const std::string what = fmt::format("rank {} → peer {}", plan.rank, peer);
  ShmOffer offer{};
  readAll(sock.get(), &offer, sizeof(offer), deadline, what + ": shared-memory offer");
  if (offer.capacity < 4096 || offer.capacity > (1ull << 32) || offer.pid != plan.peers[peer].pid) {
    SHOAL_THROW(ProtocolError, "{}: invalid shared-memory offer (pid {}, {} bytes)", what,
                offer.pid, offer.capacity);
  }
  auto seg = shm::Segment::open(offer.pid, offer.fd, shm::ShmLink::segmentBytes(offer.capacity));
  auto peerBell = openBell(plan, peer);  // Note [Segments before completion]
  char ack = 1;
  writeAll(sock.get(), &ack, 1, deadline, what);
  char ready = 0;
  readAll(sock.get(), &ready, 1, deadline, what + ": shared-memory ready");
  return std::make_unique<shm::ShmLink>(LinkContext{plan.rank, peer}, std::move(sock),
                                        std::move(seg), offer.capacity, std::move(peerBell));
}

std::unique_ptr<Link> acceptedLink(const LinkPlan& plan, int peer, Fd sock,
                                   const Deadline& deadline) {
  if (plan.kinds[peer] != LinkKind::kShm) {
    return tcpLink(plan, peer, std::move(sock), false, deadline);
  }
  const std::string what = fmt::format("rank {} ← peer {}", plan.rank, peer);
  const size_t cap = plan.shmRingBytes;
  auto seg = shm::Segment::create(shm::ShmLink::segmentBytes(cap),
                                  fmt::format("shoal-pair-{}-{}", plan.rank, peer));
  ShmOffer offer{static_cast<int32_t>(plan.self.pid), seg->fd(), cap};
  writeAll(sock.get(), &offer, sizeof(offer), deadline, what);
  char ack = 0;
  readAll(sock.get(), &ack, 1, deadline, what + ": shared-memory ack");
  auto peerBell = openBell(plan, peer);  // Note [Segments before completion]
  char ready = 1;
  writeAll(sock.get(), &ready, 1, deadline, what);
  return std::make_unique<shm::ShmLink>(LinkContext{plan.rank, peer}, std::move(sock),
                                        std::move(seg), cap, std::move(peerBell));
}

}  // namespace shoal::transport
