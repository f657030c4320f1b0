// One connection between this rank and one peer: a reliable, ordered, full-duplex byte stream.
// Framing, checking and progress live in Endpoint; a Link only moves bytes without blocking.
//
// Threading: a Link is driven by one thread at a time (its Endpoint's caller).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/frame.h"

namespace shoal::transport {

// The connection to `peer` ended without a goodbye or an abort frame: the peer died, or it shut
// the link down while aborting for a reason of its own (it could not send an abort frame in the
// middle of a data frame). Group looks for that reason before blaming the peer (see
// Note [Root cause] in comm/native/native_engine.cpp).
class ConnectionLost : public PeerError {
 public:
  ConnectionLost(const std::string& what, int peer) : PeerError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// kTls: TCP carrying TLS records (transport/tcp/tls_link.h). Everything that holds for a TCP
// link's stream (control frames travel in it, between data frames) holds for a TLS link too.
enum class LinkKind : uint8_t { kTcp, kShm, kTls };
std::string_view toString(LinkKind kind);

class Link {
 public:
  explicit Link(LinkContext ctx) : ctx_(ctx) {}
  virtual ~Link() = default;

  virtual LinkKind kind() const = 0;

  // Writes a prefix of the iovecs without blocking; returns the bytes written (0 if the link is
  // full). Throws PeerError if the peer is gone.
  virtual size_t writeSome(const iovec* iov, int iovcnt) = 0;

  // Reads up to n bytes without blocking; returns 0 if nothing is available. Throws PeerError
  // when the peer closed the stream.
  virtual size_t readSome(void* dst, size_t n) = 0;

  // Zero-copy read (shared memory): the contiguous readable bytes, to be released by consume().
  // Links that cannot offer it return {nullptr, 0}.
  virtual std::pair<const uint8_t*, size_t> peek() { return {nullptr, 0}; }
  virtual void consume(size_t) {}

  // A word in shared memory that is zero while no bytes are unread and becomes nonzero when
  // they arrive (a shared-memory link: the stamp of the ring's next record, on the line its
  // bytes will fill). A wait for this link's data spins on it as well as on the doorbell: the
  // data's line is then in cache when the wait ends (Note [Watching the ring] in
  // transport/endpoint.cpp). Null for links without one, and while bytes are already unread.
  virtual const std::atomic<uint64_t>* arrivalWatch() const { return nullptr; }

  // The TCP socket of this pair: it carries the data for TCP links and, for shared-memory
  // links, the handshake, abort frames and the end-of-file that tells a peer died.
  virtual int socketFd() const = 0;

  // Stops both directions; a peer reading sees end-of-file after what was already sent.
  virtual void shutdown() = 0;

  // The control stream: abort and goodbye frames, and the look at a peer that is not being read
  // (is it gone? did it abort?). It is the socket for TCP (between data frames) and shared
  // memory (beside the rings); a TLS link overrides all four to go through its records.
  //
  // Best effort, never blocks, never throws: writes the whole of `iov` or nothing that the peer
  // could misread. Returns whether it was written.
  virtual bool writeControl(const iovec* iov, int iovcnt) noexcept;
  // Up to n bytes at the front of the stream without consuming them: the count, 0 when nothing
  // has arrived, -1 at the end of the stream. Throws ConnectionLost when the connection failed.
  virtual long peekControl(void* dst, size_t n);
  // Consumes n bytes, waiting up to the deadline (PeerError / TimeoutError naming `what`).
  virtual void readControl(void* dst, size_t n, const Deadline& deadline, const std::string& what);
  // Bytes the link holds that its socket will no longer announce as readable (a TLS link's
  // decrypted record). The Endpoint never sleeps on a link that has them: see Note [Buffered
  // bytes] in transport/endpoint.cpp.
  virtual bool hasBuffered() const { return false; }

  const LinkContext& context() const { return ctx_; }

 protected:
  LinkContext ctx_;
};

}  // namespace shoal::transport
