// Builds a group's Endpoint: publishes how to reach this rank in the group's store, reads every
// peer's record, and plans each link (shared memory on one host, else TCP, or TLS per
// `encrypt`), without connecting anything. Links are made on first use between a pair
// (transport/mesh.h), through the world's Acceptor (transport/acceptor.h), which this group
// shares with the others of its world.
//
// Blocking, with `timeout` for reading the records. A rank that never shows up gives a
// TimeoutError naming it. Other errors: ProtocolError for a malformed record in the store;
// InvalidArgument when shm is forced across hosts. What the links' set-up checks (the HMAC
// proof of every connection, the encryption agreement, the TLS handshake) is reported when a
// link is first used (transport/endpoint.h).
#pragma once

#include <memory>
#include <string>

#include "common/env.h"
#include "store/store.h"
#include "transport/acceptor.h"
#include "transport/endpoint.h"

namespace shoal::transport {

struct BootstrapOptions {
  int rank = 0;
  int size = 1;
  uint32_t groupId = 0;
  std::shared_ptr<store::Store> store;  // already scoped to this group
  std::string secret;
  // This rank's acceptor for the group's world (required when size > 1).
  std::shared_ptr<Acceptor> acceptor;
  TransportKind transport = TransportKind::kAuto;
  EncryptMode encrypt = EncryptMode::kAuto;  // TLS on TCP links (common/encryption.h)
  size_t shmRingBytes = 4u << 20;
  // This rank's host in its record (empty: shm::hostIdentity()); see GroupOptions::hostLabel.
  std::string hostLabel;
  // Reading the records; also bounds the accepting end's half of a link's set-up.
  Duration timeout = std::chrono::seconds(60);
  EndpointOptions endpoint;
};

std::unique_ptr<Endpoint> bootstrapEndpoint(const BootstrapOptions& options);

}  // namespace shoal::transport
