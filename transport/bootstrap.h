// Builds an Endpoint: every rank of a group listens, publishes how to reach it in the group's
// store, connects to each lower rank and accepts each higher one, authenticates every
// connection, and then picks per pair shared memory (same host) or TCP.
//
// Blocking, with `timeout` for the whole bootstrap. A rank that never shows up gives a
// TimeoutError naming it. Incoming connections are handshaken concurrently, each within
// `handshakeTimeout`: one that sends nothing, garbage, a wrong proof or a hello for another
// group or rank is closed and logged, and never delays the real peers (at most 256 handshakes
// are in progress at once; further connections wait in the listen backlog).
// Every TCP link then agrees with its peer on encryption and, when they encrypt, runs its TLS
// handshake within `timeout` (transport/tcp/link_security.h; `encrypt` says when, see
// common/encryption.h); shared-memory links are never encrypted.
// Other errors: ProtocolError for a malformed address record in the store, a peer that cannot
// prove the secret, a peer whose encryption setting conflicts with this rank's (naming both) or
// a failed TLS handshake; InvalidArgument when shm is forced across hosts.
#pragma once

#include <memory>
#include <string>

#include "common/env.h"
#include "store/store.h"
#include "transport/endpoint.h"

namespace shoal::transport {

struct BootstrapOptions {
  int rank = 0;
  int size = 1;
  uint32_t groupId = 0;
  std::shared_ptr<store::Store> store;  // already scoped to this group
  std::string secret;
  TransportKind transport = TransportKind::kAuto;
  EncryptMode encrypt = EncryptMode::kAuto;  // TLS on TCP links (common/encryption.h)
  std::string listenAddress = "127.0.0.1";
  size_t shmRingBytes = 4u << 20;
  Duration timeout = std::chrono::seconds(60);
  // Per incoming connection: from accept to a complete hello.
  Duration handshakeTimeout = std::chrono::seconds(2);
  EndpointOptions endpoint;
};

std::unique_ptr<Endpoint> bootstrapEndpoint(const BootstrapOptions& options);

}  // namespace shoal::transport
