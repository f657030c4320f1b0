#include "transport/tcp/tcp_link.h"

#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/error.h"

namespace shoal::transport::tcp {

TcpLink::TcpLink(LinkContext ctx, Fd socket) : Link(ctx), fd_(std::move(socket)) {
  // Bigger kernel buffers mean fewer wake-ups per megabyte on loopback.
  int size = 4 << 20;
  ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

size_t TcpLink::writeSome(const iovec* iov, int iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
  for (;;) {
    ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) return static_cast<size_t>(w);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw ConnectionLost(fmt::format("rank {} → peer {}: connection lost while sending ({})",
                                     ctx_.rank, ctx_.peer, std::strerror(errno)),
                         ctx_.peer);
  }
}

size_t TcpLink::readSome(void* dst, size_t n) {
  for (;;) {
    ssize_t r = ::recv(fd_.get(), dst, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) {
      throw ConnectionLost(fmt::format("rank {} ← peer {}: connection closed by peer {}", ctx_.rank,
                                       ctx_.peer, ctx_.peer),
                           ctx_.peer);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw ConnectionLost(fmt::format("rank {} ← peer {}: connection lost while receiving ({})",
                                     ctx_.rank, ctx_.peer, std::strerror(errno)),
                         ctx_.peer);
  }
}

void TcpLink::shutdown() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace shoal::transport::tcp
