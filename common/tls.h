// TLS 1.3 over a connected, already authenticated, non-blocking TCP socket, keyed by an external
// pre-shared key (common/encryption.h derives it from the job secret): no certificates. The one
// place that uses OpenSSL's libssl, behind a small RAII type.
//
// Protocol: TLS 1.3 only, TLS_AES_128_GCM_SHA256 only (AES-NI makes it the fastest suite on the
// x86 servers this runs on), PSK with (EC)DHE key exchange (psk_dhe_ke: traffic recorded today
// stays secret if the job secret leaks later), no session tickets. The client refuses any
// handshake that did not use the PSK (a certificate from a man in the middle is never
// accepted), and the server has no certificate to offer: a peer with another key fails the
// handshake.
//
// Threading: a Session is used by one thread at a time. It does not own the socket (its owner
// closes it after destroying the Session) and installs no signal handler: it writes with
// MSG_NOSIGNAL like every other socket write in Shoal.
//
// Note [Read ahead]: reads take up to 256 KiB from the socket at once (many records per
// recv(2)), so after a read or a handshake OpenSSL may hold records that the socket will never
// announce again. buffered() says so until a read() finds nothing more (kWantRead: OpenSSL then
// asked the socket, found it empty, and holds at most part of a record). A caller that sleeps
// on the socket's readiness must read first while buffered() is true.
//
// Non-blocking calls return a Result; kWantRead / kWantWrite say which readiness of the socket
// to wait for before calling again. Note [TLS write retry]: a write() that returns kWantWrite
// has already taken its bytes into a TLS record it could not send in full; the caller must call
// write() again with the same bytes (at least as many, same content; the address may change)
// before writing anything else, and only that call reports them written. Errors: ProtocolError
// for a TLS failure (a wrong key, a peer that does not speak TLS, a record that fails
// authentication), with OpenSSL's reason; the end of the connection is a Result (kClosed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/deadline.h"

namespace shoal::tls {

// The largest plaintext of one TLS record; write() takes at most this per call.
inline constexpr size_t kMaxRecord = 16384;
// A sender moves to a new key (TLS 1.3 KeyUpdate) after this many records (16 GiB of full
// records), well inside the 2^24.5 records RFC 8446 allows one AES-GCM key; a training job's
// link can carry far more than that.
inline constexpr uint64_t kRecordsPerKey = uint64_t{1} << 20;

class Session {
 public:
  enum class Role { kClient, kServer };
  enum class Status { kOk, kWantRead, kWantWrite, kClosed };
  struct Result {
    size_t bytes = 0;
    Status status = Status::kOk;
  };

  // `psk`: the key both ends derived (32 bytes). `what` names the connection in every error
  // ("rank 1 → peer 0", "store 10.0.0.1:29400"). Throws SystemError if OpenSSL fails.
  Session(int fd, Role role, const std::string& psk, std::string what);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One non-blocking step of the handshake: kOk once it is complete. Throws ProtocolError
  // "<what>: TLS handshake failed: <reason>" (a wrong key, a peer that does not encrypt),
  // PeerError when the peer closes the connection.
  Status handshakeStep();
  // The whole handshake, blocking up to the deadline (TimeoutError after it).
  void handshake(const Deadline& deadline);

  // Non-blocking. read() and peek() return at most one record's bytes; bytes > 0 means kOk.
  Result read(void* dst, size_t n);
  Result peek(void* dst, size_t n);
  // Non-blocking; n <= kMaxRecord (one record). See Note [TLS write retry].
  Result write(const void* src, size_t n);
  // For tests: a KeyUpdate every `records` records instead of kRecordsPerKey.
  void rekeyEvery(uint64_t records) { rekeyEvery_ = records; }
  // Whether a write() is waiting to be repeated (Note [TLS write retry]).
  bool writePending() const { return pendingWrite_ > 0; }
  // Whether the next read() may return bytes the socket will not announce (Note [Read ahead]).
  bool buffered() const;
  // Why the last call returned kClosed ("closed by peer", "Connection reset by peer").
  const std::string& closeReason() const { return closeReason_; }

  // Blocking with a deadline, like common/socket.h's writeAll / readAll: PeerError when the
  // connection ends, TimeoutError at the deadline.
  void writeAll(const void* src, size_t n, const Deadline& deadline);
  void readAll(void* dst, size_t n, const Deadline& deadline);

  const std::string& what() const { return what_; }

 private:
  Result finish(int rc);
  Result readResult(int rc);
  void wait(Status status, const Deadline& deadline, const char* doing);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int fd_;
  std::string what_;
  std::string failure_;  // OpenSSL's reason for the last failure
  size_t pendingWrite_ = 0;
  uint64_t rekeyEvery_ = kRecordsPerKey;
  uint64_t recordsThisKey_ = 0;
  bool unannounced_ = false;  // Note [Read ahead]
  std::string closeReason_;
};

}  // namespace shoal::tls
