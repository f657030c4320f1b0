// A Link over one TCP connection carrying TLS 1.3 records (common/tls.h), for peers on other
// hosts (see common/encryption.h for when). Made by transport/tcp/link_security.h after the
// handshake; otherwise it behaves as a TcpLink: non-blocking, the Endpoint sleeps in epoll on
// its socket.
//
// What differs from TcpLink, and how the Endpoint is kept right:
// - Writes go out one record (at most 16 KiB) per SSL_write. A record the socket could not take
//   in full is held by OpenSSL and reported written only when it is sent (Note [TLS write
//   retry] in common/tls.h): the Endpoint retries the same transfer from the same offset, so
//   the retry offers the same bytes. Control frames are not written while such a record waits
//   (writeControl returns false), since they would land in the middle of a data frame.
// - Reads return one record's bytes at a time, and OpenSSL reads ahead (Note [Read ahead] in
//   common/tls.h): records it holds are not announced by the socket; hasBuffered() tells the
//   Endpoint (Note [Buffered bytes] in transport/endpoint.cpp).
// - Control frames (abort, goodbye) travel inside the records, like data.
// - A record that fails authentication (tampered with, or garbage) is a ProtocolError naming
//   the link; the end of the connection is a ConnectionLost, as for TcpLink.
//
// Threading: as every Link, one thread at a time; shutdown() of the socket from another thread
// (Endpoint::interrupt) only makes the owner's next call fail.
#pragma once

#include <memory>
#include <vector>

#include "common/socket.h"
#include "common/tls.h"
#include "transport/link.h"

namespace shoal::transport::tcp {

class TlsLink : public Link {
 public:
  // `session` has completed its handshake on `socket`.
  TlsLink(LinkContext ctx, Fd socket, std::unique_ptr<tls::Session> session);

  LinkKind kind() const override { return LinkKind::kTls; }
  size_t writeSome(const iovec* iov, int iovcnt) override;
  size_t readSome(void* dst, size_t n) override;
  int socketFd() const override { return fd_.get(); }
  void shutdown() override;

  bool writeControl(const iovec* iov, int iovcnt) noexcept override;
  long peekControl(void* dst, size_t n) override;
  void readControl(void* dst, size_t n, const Deadline& deadline, const std::string& what) override;
  bool hasBuffered() const override { return session_->buffered(); }

 private:
  [[noreturn]] void throwLost(bool sending);

  Fd fd_;  // declared first: closed after the session is freed
  std::unique_ptr<tls::Session> session_;
  std::vector<uint8_t> staging_;  // one record gathered from several iovecs
  // A control frame's record OpenSSL holds unsent (writeControl): sent before any more data.
  size_t controlHeld_ = 0;
};

}  // namespace shoal::transport::tcp
