#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace shoal {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string HostPort::str() const {
  return fmt::format("{}:{}", host, port);
}

HostPort parseHostPort(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
    SHOAL_THROW(InvalidArgument, "address '{}': expected host:port", s);
  }
  HostPort hp;
  hp.host = s.substr(0, colon);
  char* end = nullptr;
  long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    SHOAL_THROW(InvalidArgument, "address '{}': port must be 1..65535", s);
  }
  hp.port = static_cast<int>(port);
  return hp;
}

void setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throwSystemError("fcntl(O_NONBLOCK)", errno);
  }
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "*" || host == "0.0.0.0") {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    return sa;
  }
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    SHOAL_THROW(InvalidArgument, "cannot resolve host '{}': {}", host, ::gai_strerror(rc));
  }
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return sa;
}

}  // namespace

std::optional<std::string> resolveIPv4(const std::string& host) {
  try {
    sockaddr_in sa = resolve(host, 0);
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
    return std::string(text);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

bool isLoopback(const std::string& ipv4) {
  return ipv4.rfind("127.", 0) == 0;
}

std::optional<std::string> sourceAddressFor(const std::string& host) {
  auto ip = resolveIPv4(host);
  if (!ip) return std::nullopt;
  // Connecting a UDP socket sends nothing; it only asks the kernel for the route's source.
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return std::nullopt;
  sockaddr_in sa = resolve(*ip, 9);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0) return std::nullopt;
  socklen_t len = sizeof(sa);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) < 0) return std::nullopt;
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
  return std::string(text);
}

std::optional<std::string> firstExternalIPv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) < 0) return std::nullopt;
  std::optional<std::string> out;
  for (ifaddrs* i = list; i && !out; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    out = std::string(text);
  }
  ::freeifaddrs(list);
  return out;
}

bool pollFor(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.remainingMs());
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throwSystemError("poll", errno);
  }
}

bool isSelfConnected(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t localLen = sizeof(local), peerLen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0 ||
      local.ss_family != peer.ss_family) {
    return false;
  }
  if (local.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(local);
    const auto& b = reinterpret_cast<const sockaddr_in&>(peer);
    return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(peer);
    return a.sin6_port == b.sin6_port &&
           std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof(a.sin6_addr)) == 0;
  }
  return false;
}

bool isLoopbackConnection(int fd) {
  auto loopback = [](const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) {
      const auto& in = reinterpret_cast<const sockaddr_in&>(a);
      return (ntohl(in.sin_addr.s_addr) >> 24) == 127;
    }
    if (a.ss_family == AF_INET6) {
      return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr) != 0;
    }
    return a.ss_family == AF_UNIX;
  };
  sockaddr_storage local{}, peer{};
  socklen_t localLen = sizeof(local), peerLen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0) {
    return false;
  }
  return loopback(local) && loopback(peer);
}

Fd listenTcp(const std::string& host, int port, int* boundPort, int backlog) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throwSystemError("socket", errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = resolve(host, port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0) {
    int err = errno;
    SHOAL_THROW(SystemError, "cannot listen on {}:{}: {}", host, port, std::strerror(err));
  }
  if (::listen(fd.get(), backlog) < 0) throwSystemError("listen", errno);
  socklen_t len = sizeof(sa);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  if (boundPort) *boundPort = ntohs(sa.sin_port);
  setNonBlocking(fd.get());
  return fd;
}

Fd connectTcp(const HostPort& addr, const Deadline& deadline, const std::string& what) {
  int lastErr = 0;
  std::string lastResolveError;
  auto backoff = std::chrono::milliseconds(1);
  while (!deadline.expired()) {
    sockaddr_in sa;
    try {
      sa = resolve(addr.host, addr.port);
    } catch (const InvalidArgument& e) {
      // A name that does not resolve yet (a Kubernetes pod's DNS record appears only once the
      // pod runs) is retried like a refused connection.
      lastResolveError = e.what();
      std::this_thread::sleep_for(
          std::min<Duration>(std::chrono::milliseconds(200), deadline.remaining()));
      continue;
    }
    lastResolveError.clear();
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) throwSystemError("socket", errno);
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc < 0 && errno == EINPROGRESS) {
      if (pollFor(fd.get(), POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0 && isSelfConnected(fd.get())) {
      rc = -1;  // nobody listens there yet: as refused
      errno = ECONNREFUSED;
    }
    if (rc == 0) {
      setNoDelay(fd.get());
      return fd;
    }
    lastErr = errno;
    // Refused: the listener is not up yet. Retry with a short, growing pause (never a spin).
    auto pause = std::min<Duration>(backoff, deadline.remaining());
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  SHOAL_THROW(
      TimeoutError, "{}: could not connect to {} within {:.1f} s (last error: {})", what,
      addr.str(), deadline.timeoutSeconds(),
      !lastResolveError.empty() ? lastResolveError : (lastErr ? std::strerror(lastErr) : "none"));
}

Fd acceptTcp(int listenFd, const Deadline& deadline, const std::string& what) {
  for (;;) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      setNoDelay(fd);
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throwSystemError("accept", errno);
    }
    if (!pollFor(listenFd, POLLIN, deadline)) {
      SHOAL_THROW(TimeoutError, "{}: no connection arrived within {:.1f} s", what,
                  deadline.timeoutSeconds());
    }
  }
}

void writeAll(int fd, const void* data, size_t n, const Deadline& deadline,
              const std::string& what) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!pollFor(fd, POLLOUT, deadline)) {
        SHOAL_THROW(TimeoutError, "{}: send timed out after {:.1f} s", what,
                    deadline.timeoutSeconds());
      }
      continue;
    }
    SHOAL_THROW(PeerError, "{}: connection lost while sending ({})", what, std::strerror(errno));
  }
}

void readAll(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) SHOAL_THROW(PeerError, "{}: connection closed by peer", what);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!pollFor(fd, POLLIN, deadline)) {
        SHOAL_THROW(TimeoutError, "{}: receive timed out after {:.1f} s", what,
                    deadline.timeoutSeconds());
      }
      continue;
    }
    SHOAL_THROW(PeerError, "{}: connection lost while receiving ({})", what, std::strerror(errno));
  }
}

}  // namespace shoal
