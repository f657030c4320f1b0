// What one rank knows about the others of a group, and the two halves of making one link.
//
// Every rank of a group publishes a PeerRecord in the group's store when the group is created
// (transport/bootstrap.h): where its acceptor listens, its host identity, its pid and the
// descriptor of its doorbell. From the records and the options, the LinkPlan says up front which
// kind each link will have (shared memory on one host, else TCP or TLS), so nothing needs to be
// connected to know it. The link itself is made on first use (transport/mesh.h): the dialing end
// runs dialedLink(), the accepting end (its acceptor thread) acceptedLink(), both right after
// the HMAC handshake on the same socket.
//
// Shared memory: the accepting end creates the pair segment and offers it; the dialing end opens
// it and the acceptor's doorbell and acks; the acceptor opens the dialer's doorbell and says
// "ready" (Note [Segments before completion] in link_setup.cpp). TCP: both ends agree on
// encryption and, when they encrypt, run TLS with the dialing end as client
// (transport/tcp/link_security.h).
//
// Both calls block up to `deadline` and take ownership of the socket. They throw ProtocolError
// for a malformed offer or a failed agreement, PeerError when the peer closes or its segments
// cannot be opened (it is gone), TimeoutError at the deadline.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/encryption.h"
#include "common/env.h"
#include "common/socket.h"
#include "common/types.h"
#include "transport/link.h"
#include "transport/shm/segment.h"

namespace shoal::transport {

struct PeerRecord {
  HostPort address;  // the rank's acceptor
  std::string host;  // shm::hostIdentity()
  pid_t pid = 0;
  int bellFd = -1;  // its doorbell segment, -1 without shared memory
};

std::string encodeRecord(const PeerRecord& record);
// Records come from the network: checked, never trusted (ProtocolError naming `peer`).
PeerRecord decodeRecord(const std::string& text, int peer);

struct LinkPlan {
  int rank = 0;
  int size = 1;
  uint32_t groupId = 0;
  std::string secret;
  EncryptMode encrypt = EncryptMode::kAuto;
  size_t shmRingBytes = 4u << 20;
  // Bounds the accepting end's half of a set-up (the dialing end uses its operation's deadline).
  Duration timeout = std::chrono::seconds(60);
  PeerRecord self;
  std::shared_ptr<shm::Segment> bell;  // this rank's doorbell; null without shared memory
  std::vector<PeerRecord> peers;       // [rank] is self
  // The kind each link will have (planLinks()); [rank] is unused.
  std::vector<LinkKind> kinds;
};

// Fills plan.kinds from the records. Throws InvalidArgument when shared memory is forced
// (`transport` kShm) but a peer is on another host.
void planLinks(LinkPlan& plan, TransportKind transport);

std::unique_ptr<Link> dialedLink(const LinkPlan& plan, int peer, Fd socket,
                                 const Deadline& deadline);
std::unique_ptr<Link> acceptedLink(const LinkPlan& plan, int peer, Fd socket,
                                   const Deadline& deadline);

}  // namespace shoal::transport
