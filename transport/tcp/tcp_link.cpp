#include "transport/tcp/tcp_link.h"

#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/error.h"

namespace shoal::transport::tcp {

TcpLink::TcpLink(LinkContext ctx, Fd socket) : Link(ctx), fd_(std::move(socket)) {
  // The kernel sizes the socket buffers (net.ipv4.tcp_rmem / tcp_wmem autotuning). Setting
  // SO_SNDBUF / SO_RCVBUF turns that off and caps them at net.core.[rw]mem_max: 4 MiB fixed
  // buffers here moved 16-64 MiB 15-22% slower over loopback than autotuned ones
  // (bench/results/p2p.md), and a fixed window caps a link with a large bandwidth-delay product.
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
