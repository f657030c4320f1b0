#include "transport/tcp/tls_link.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace shoal::transport::tcp {

using Status = tls::Session::Status;

TlsLink::TlsLink(LinkContext ctx, Fd socket, std::unique_ptr<tls::Session> session)
    : Link(ctx), fd_(std::move(socket)), session_(std::move(session)), staging_(tls::kMaxRecord) {
  // Kernel buffers as TcpLink: left to the kernel's autotuning.
}

void TlsLink::throwLost(bool sending) {
  const std::string& why = session_->closeReason();
  if (!sending && why == "closed by peer") {
    throw ConnectionLost(fmt::format("rank {} ← peer {}: connection closed by peer {}", ctx_.rank,
                                     ctx_.peer, ctx_.peer),
                         ctx_.peer);
  }
  throw ConnectionLost(
      fmt::format("rank {} {} peer {}: connection lost while {} ({})", ctx_.rank,
                  sending ? "→" : "←", ctx_.peer, sending ? "sending" : "receiving", why),
      ctx_.peer);
}

size_t TlsLink::writeSome(const iovec* iov, int iovcnt) {
  if (controlHeld_ > 0) {
    // Repeats the control record's write (Note [TLS write retry]) before anything else.
    auto r = session_->write(staging_.data(), controlHeld_);
    if (r.status == Status::kClosed) throwLost(true);
    if (r.status != Status::kOk) return 0;
    controlHeld_ = 0;
  }
  size_t written = 0;
  int i = 0;
  size_t off = 0;  // into iov[i]
  for (;;) {
    while (i < iovcnt && off == iov[i].iov_len) {
      ++i;
      off = 0;
    }
    if (i == iovcnt) return written;
    // The next record: straight from the caller's buffer when one iovec fills it (the payload
    // of a large frame), else gathered (a header with the start of its payload, in one record
    // and one segment on the wire). The same offset always yields the same record, as a retry
    // needs (Note [TLS write retry]).
    const uint8_t* src = static_cast<const uint8_t*>(iov[i].iov_base) + off;
    size_t len = std::min(iov[i].iov_len - off, tls::kMaxRecord);
    if (len < tls::kMaxRecord && i + 1 < iovcnt) {
      len = 0;
      for (int j = i; j < iovcnt && len < tls::kMaxRecord; ++j) {
        const size_t from = j == i ? off : 0;
        const size_t take = std::min(iov[j].iov_len - from, tls::kMaxRecord - len);
        std::memcpy(staging_.data() + len, static_cast<const uint8_t*>(iov[j].iov_base) + from,
                    take);
        len += take;
      }
      src = staging_.data();
    }
    // A TLS failure is a ProtocolError naming this link (bytes that fail authentication are a
    // bad frame, not a peer that went away).
    const tls::Session::Result r = session_->write(src, len);
    if (r.status == Status::kClosed) {
      if (written > 0) return written;  // the next call reports it
      throwLost(true);
    }
    if (r.status != Status::kOk) return written;
    written += r.bytes;
    // Advance the iovec cursor by the record's bytes.
    size_t left = r.bytes;
    while (left > 0) {
      const size_t step = std::min(left, iov[i].iov_len - off);
      off += step;
      left -= step;
      if (off == iov[i].iov_len && left > 0) {
        ++i;
        off = 0;
      }
    }
  }
}

size_t TlsLink::readSome(void* dst, size_t n) {
  const tls::Session::Result r = session_->read(dst, n);
  if (r.status == Status::kOk) return r.bytes;
  if (r.status == Status::kClosed) throwLost(false);
  return 0;  // want read (or, rarely, want write: the socket's next edge wakes the Endpoint)
}

void TlsLink::shutdown() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

bool TlsLink::writeControl(const iovec* iov, int iovcnt) noexcept {
  // A data record waits to be repeated: the control frame would follow a partial data frame.
  if (session_->writePending()) return false;
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  if (len == 0 || len > tls::kMaxRecord) return false;
  try {
    for (int i = 0, at = 0; i < iovcnt; at += static_cast<int>(iov[i].iov_len), ++i) {
      std::memcpy(staging_.data() + at, iov[i].iov_base, iov[i].iov_len);
    }
    // One record. If the socket cannot take all of it, OpenSSL holds the rest and sends it with
    // the next write; a shutdown right after may lose it, as for a TCP link's unsent bytes.
    const auto r = session_->write(staging_.data(), len);
    if (r.status == Status::kWantRead || r.status == Status::kWantWrite) controlHeld_ = len;
    return r.status == Status::kOk;
  } catch (...) {
    return false;
  }
}

long TlsLink::peekControl(void* dst, size_t n) {
  const tls::Session::Result r = session_->peek(dst, n);
  if (r.status == Status::kOk) return static_cast<long>(r.bytes);
  if (r.status == Status::kClosed) return -1;
  return 0;
}

void TlsLink::readControl(void* dst, size_t n, const Deadline& deadline, const std::string&) {
  session_->readAll(dst, n, deadline);  // its errors name the link already
}

}  // namespace shoal::transport::tcp
