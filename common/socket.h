// TCP socket helpers shared by the store and the transports. All sockets are non-blocking;
// the blocking helpers here wait with poll(2) against a deadline, never indefinitely.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "common/deadline.h"

namespace shoal {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;
};

// "host:port" -> HostPort; InvalidArgument on a malformed string.
HostPort parseHostPort(const std::string& s);

// Name -> dotted IPv4, or nothing if it does not resolve.
std::optional<std::string> resolveIPv4(const std::string& host);
bool isLoopback(const std::string& ipv4);
// The local address the kernel would use to reach `host` (the address to advertise to it).
std::optional<std::string> sourceAddressFor(const std::string& host);
// The first IPv4 address of an interface that is up and not loopback.
std::optional<std::string> firstExternalIPv4();

// Listens on host:port (port 0 picks a free one); returns the socket and the bound port.
Fd listenTcp(const std::string& host, int port, int* boundPort, int backlog = 128);

// Connects, retrying refused/unreachable connections (and a connection to itself, see
// isSelfConnected) until the deadline. Throws TimeoutError naming the address (`what` says who
// is connecting to what) when the deadline passes.
Fd connectTcp(const HostPort& addr, const Deadline& deadline, const std::string& what);

// Accepts one connection or throws TimeoutError.
Fd acceptTcp(int listenFd, const Deadline& deadline, const std::string& what);

// Whether a connected TCP socket is connected to itself (the same address and port at both
// ends). A connect to a port nobody listens on may pick that very port as its own source port
// (ephemeral ports and ports bound to 0 come from one range) and then "succeed" by TCP's
// simultaneous open: the caller would wait for a greeting that never comes. Callers treat it as
// refused. False when either address cannot be read.
bool isSelfConnected(int fd);

// Whether both ends of a connected socket are loopback addresses (127.0.0.0/8, ::1) or it is a
// Unix socket: traffic that never leaves this host's kernel. False when either address cannot be
// read (the safe answer for a caller deciding whether to encrypt).
bool isLoopbackConnection(int fd);

// Waits for `events` (poll(2) flags) on fd; false when the deadline passed first.
bool pollFor(int fd, short events, const Deadline& deadline);

void setNonBlocking(int fd);
void setNoDelay(int fd);

// Blocking-with-deadline transfers on a non-blocking socket. A closed connection is a
// PeerError, a deadline a TimeoutError; both name `what`.
void writeAll(int fd, const void* data, size_t n, const Deadline& deadline,
              const std::string& what);
void readAll(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what);

}  // namespace shoal
