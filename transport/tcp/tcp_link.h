// A Link over one TCP connection (non-blocking, TCP_NODELAY). Large payloads go from and to the
// caller's buffer directly; the kernel splits them, there is no staging copy.
#pragma once

#include "common/socket.h"
#include "transport/link.h"

namespace shoal::transport::tcp {

class TcpLink : public Link {
 public:
  TcpLink(LinkContext ctx, Fd socket);

  LinkKind kind() const override { return LinkKind::kTcp; }
  size_t writeSome(const iovec* iov, int iovcnt) override;
  size_t readSome(void* dst, size_t n) override;
  int socketFd() const override { return fd_.get(); }
  void shutdown() override;

 private:
  Fd fd_;
};

}  // namespace shoal::transport::tcp
