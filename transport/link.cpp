#include "transport/link.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/socket.h"

namespace shoal::transport {

std::string_view toString(LinkKind kind) {
  switch (kind) {
    case LinkKind::kTcp:
      return "tcp";
    case LinkKind::kShm:
      return "shm";
    case LinkKind::kTls:
      return "tls";
  }
  return "invalid";
}

bool Link::writeControl(const iovec* iov, int iovcnt) noexcept {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return ::sendmsg(socketFd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(total);
}

long Link::peekControl(void* dst, size_t n) {
  for (;;) {
    ssize_t r = ::recv(socketFd(), dst, n, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return static_cast<long>(r);
    if (r == 0) return -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw ConnectionLost(fmt::format("rank {} ← peer {}: connection lost ({})", ctx_.rank,
                                     ctx_.peer, std::strerror(errno)),
                         ctx_.peer);
  }
}

void Link::readControl(void* dst, size_t n, const Deadline& deadline, const std::string& what) {
  readAll(socketFd(), dst, n, deadline, what);
}

}  // namespace shoal::transport
