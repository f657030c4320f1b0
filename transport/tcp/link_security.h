// Turns an authenticated TCP connection between two ranks into a Link: agrees with the peer on
// encryption (common/encryption.h) and, when they encrypt, runs the TLS 1.3 handshake keyed
// from the job secret. The one place the bootstrap asks for a TCP link.
//
// Blocking, within `deadline` (the bootstrap's: the peer proved the secret, so it is a rank of
// this job and may be waited on like the shared-memory offer). Both ends call it right after
// the HMAC handshake, the connector as TLS client. Throws ProtocolError naming the peer when the
// settings conflict (one end requires TLS, the other refuses it) or the TLS handshake fails
// (the two ends derived different keys), PeerError when the peer closes, TimeoutError at the
// deadline.
#pragma once

#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/encryption.h"
#include "common/socket.h"
#include "transport/link.h"

namespace shoal::transport::tcp {

struct LinkSecurity {
  EncryptMode mode = EncryptMode::kAuto;
  const std::string* secret = nullptr;  // the job secret (borrowed for the call)
  uint32_t groupId = 0;
  bool connector = false;     // this end connected (TLS client)
  bool crossesHosts = false;  // the peer has another host identity
};

std::unique_ptr<Link> secureTcpLink(LinkContext ctx, Fd socket, const LinkSecurity& security,
                                    const Deadline& deadline);

}  // namespace shoal::transport::tcp
