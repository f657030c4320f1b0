#include "transport/tcp/link_security.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "common/tls.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tls_link.h"

namespace shoal::transport::tcp {

std::unique_ptr<Link> secureTcpLink(LinkContext ctx, Fd socket, const LinkSecurity& s,
                                    const Deadline& deadline) {
  const std::string what =
      fmt::format("rank {} {} peer {}", ctx.rank, s.connector ? "→" : "←", ctx.peer);
  const bool encrypt = encryption::negotiate(socket.get(), s.mode, s.crossesHosts, deadline, what);
  if (!encrypt) return std::make_unique<TcpLink>(ctx, std::move(socket));
  SHOAL_CHECK(s.secret != nullptr && !s.secret->empty(), "{}: TLS needs the job secret", what);
  // One key per pair of ranks in the group: a key never serves two purposes.
  const std::string psk = encryption::derivePsk(
      *s.secret, fmt::format("data|group {}|ranks {}-{}", s.groupId, std::min(ctx.rank, ctx.peer),
                             std::max(ctx.rank, ctx.peer)));
  auto session = std::make_unique<tls::Session>(
      socket.get(), s.connector ? tls::Session::Role::kClient : tls::Session::Role::kServer, psk,
      what);
  session->handshake(deadline);
  SHOAL_LOG_DEBUG("{}: TLS 1.3 established", what);
  return std::make_unique<TlsLink>(ctx, std::move(socket), std::move(session));
}

}  // namespace shoal::transport::tcp
