#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/openssl_socket.h"
#include "common/socket.h"

namespace shoal::tls {

namespace {

// The PSK identity travels in clear; it names the scheme, never the job or the group.
constexpr unsigned char kIdentity[] = "shoal-psk-v1";
constexpr size_t kIdentityBytes = sizeof(kIdentity) - 1;
// TLS_AES_128_GCM_SHA256
constexpr unsigned char kSuiteId[] = {0x13, 0x01};
constexpr const char* kSuiteName = "TLS_AES_128_GCM_SHA256";
constexpr size_t kReadAhead = 256 << 10;

SSL_SESSION* pskSession(SSL* ssl, const std::string& psk) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuiteId);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (!SSL_SESSION_set1_master_key(s, reinterpret_cast<const unsigned char*>(psk.data()),
                                   psk.size()) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

}  // namespace

struct Session::Impl {
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  std::string psk;

  ~Impl() {
    if (ssl) SSL_free(ssl);  // frees the BIO too
    if (ctx) SSL_CTX_free(ctx);
  }

  // Client: offer the PSK (again after a HelloRetryRequest only if the hash still fits).
  static int useSession(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
                        SSL_SESSION** sess) {
    auto* self = static_cast<Impl*>(SSL_get_app_data(ssl));
    *sess = nullptr;
    *id = nullptr;
    *idlen = 0;
    if (md != nullptr && EVP_MD_get_type(md) != NID_sha256) return 1;
    SSL_SESSION* s = pskSession(ssl, self->psk);
    if (s == nullptr) return 0;
    *sess = s;
    *id = kIdentity;
    *idlen = kIdentityBytes;
    return 1;
  }

  // Server: the one identity it knows; anything else gets no PSK, and with no certificate to
  // fall back on the handshake fails.
  static int findSession(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
    auto* self = static_cast<Impl*>(SSL_get_app_data(ssl));
    *sess = nullptr;
    if (idlen != kIdentityBytes || std::memcmp(id, kIdentity, idlen) != 0) return 1;
    SSL_SESSION* s = pskSession(ssl, self->psk);
    if (s == nullptr) return 0;
    *sess = s;
    return 1;
  }
};

Session::Session(int fd, Role role, const std::string& psk, std::string what)
    : impl_(std::make_unique<Impl>()), fd_(fd), what_(std::move(what)) {
  auto fail = [&](const char* step) {
    SHOAL_THROW(SystemError, "{}: OpenSSL failed to set up TLS ({}: {})", what_, step, sslReason());
  };
  Impl& m = *impl_;
  m.psk = psk;
  m.ctx = SSL_CTX_new(role == Role::kClient ? TLS_client_method() : TLS_server_method());
  if (m.ctx == nullptr) fail("SSL_CTX_new");
  if (!SSL_CTX_set_min_proto_version(m.ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_max_proto_version(m.ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(m.ctx, kSuiteName)) {
    fail("protocol settings");
  }
  SSL_CTX_set_options(m.ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_num_tickets(m.ctx, 0);
  // Partial writes: one record per SSL_write (Note [TLS write retry]); moving buffers: a retry
  // may come from a buffer that was reallocated (the store server's output string).
  SSL_CTX_set_mode(m.ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read ahead into a large buffer: one recv(2) takes many records instead of two calls per
  // record (header, then body). Records read ahead are processed by the next read(); a read()
  // that returns nothing has asked the socket and found it empty (Note [Buffered bytes]).
  SSL_CTX_set_read_ahead(m.ctx, 1);
  SSL_CTX_set_default_read_buffer_len(m.ctx, kReadAhead);
  // A client verifies any certificate against an empty trust store, so only a PSK handshake
  // can succeed.
  if (role == Role::kClient) SSL_CTX_set_verify(m.ctx, SSL_VERIFY_PEER, nullptr);

  m.ssl = SSL_new(m.ctx);
  if (m.ssl == nullptr) fail("SSL_new");
  SSL_set_app_data(m.ssl, &m);
  if (role == Role::kClient) {
    SSL_set_psk_use_session_callback(m.ssl, &Impl::useSession);
    SSL_set_connect_state(m.ssl);
  } else {
    SSL_set_psk_find_session_callback(m.ssl, &Impl::findSession);
    SSL_set_accept_state(m.ssl);
  }
  BIO* bio = newSocketBio(fd);
  if (bio == nullptr) fail("BIO_new");
  SSL_set_bio(m.ssl, bio, bio);  // the SSL owns the BIO
}

Session::~Session() = default;

Session::Result Session::finish(int rc) {
  const int savedErrno = errno;
  const int err = SSL_get_error(impl_->ssl, rc);
  switch (err) {
    case SSL_ERROR_WANT_READ:
      return {0, Status::kWantRead};
    case SSL_ERROR_WANT_WRITE:
      return {0, Status::kWantWrite};
    case SSL_ERROR_ZERO_RETURN:
      closeReason_ = "closed by peer";
      return {0, Status::kClosed};
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      closeReason_ = savedErrno != 0 ? std::strerror(savedErrno) : "closed by peer";
      return {0, Status::kClosed};
    default:
      failure_ = sslReason();
      SHOAL_THROW(ProtocolError, "{}: TLS failed: {}", what_, failure_);
  }
}

Session::Status Session::handshakeStep() {
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_do_handshake(impl_->ssl);
  if (rc == 1) {
    // Defence in depth: the client already refuses certificates; a handshake that succeeded
    // without our PSK is not ours.
    if (!SSL_session_reused(impl_->ssl)) {
      SHOAL_THROW(ProtocolError, "{}: TLS handshake completed without the job's key", what_);
    }
    unannounced_ = true;  // the peer's first records may have been read ahead with its Finished
    return Status::kOk;
  }
  Result r;
  try {
    r = finish(rc);
  } catch (const ProtocolError&) {
    SHOAL_THROW(ProtocolError,
                "{}: TLS handshake failed (a different job secret on the peer, or not TLS?): {}",
                what_, failure_);
  }
  if (r.status == Status::kClosed) {
    SHOAL_THROW(PeerError,
                "{}: the peer closed the connection during the TLS handshake ({}; a different "
                "job secret on the peer?)",
                what_, closeReason_);
  }
  return r.status;
}

void Session::wait(Status status, const Deadline& deadline, const char* doing) {
  const short events = status == Status::kWantWrite ? POLLOUT : POLLIN;
  if (!pollFor(fd_, events, deadline)) {
    SHOAL_THROW(TimeoutError, "{}: {} timed out after {:.1f} s", what_, doing,
                deadline.timeoutSeconds());
  }
}

void Session::handshake(const Deadline& deadline) {
  for (;;) {
    const Status s = handshakeStep();
    if (s == Status::kOk) return;
    wait(s, deadline, "TLS handshake");
  }
}

Session::Result Session::read(void* dst, size_t n) {
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_read(impl_->ssl, dst, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  return readResult(rc);
}

Session::Result Session::peek(void* dst, size_t n) {
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_peek(impl_->ssl, dst, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  return readResult(rc);
}

Session::Result Session::readResult(int rc) {
  if (rc > 0) {
    unannounced_ = true;
    return {static_cast<size_t>(rc), Status::kOk};
  }
  Result r = finish(rc);
  // Wanting to read means OpenSSL asked the socket and found it empty: what it holds now is at
  // most part of a record, and the rest will make the socket readable.
  if (r.status == Status::kWantRead || r.status == Status::kWantWrite) unannounced_ = false;
  return r;
}

Session::Result Session::write(const void* src, size_t n) {
  SHOAL_ASSERT(n > 0 && n <= kMaxRecord, "{}: TLS write of {} bytes", what_, n);
  // Note [TLS write retry]: repeat exactly the length OpenSSL holds a record for.
  if (pendingWrite_ > 0) {
    SHOAL_ASSERT(n >= pendingWrite_, "{}: TLS write retried with {} of {} bytes", what_, n,
                 pendingWrite_);
    n = pendingWrite_;
  } else if (++recordsThisKey_ >= rekeyEvery_) {
    // Sent ahead of this record by the SSL_write below (and so retried with it).
    if (SSL_key_update(impl_->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1) {
      SHOAL_THROW(ProtocolError, "{}: TLS key update failed: {}", what_, sslReason());
    }
    recordsThisKey_ = 0;
  }
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_write(impl_->ssl, src, static_cast<int>(n));
  if (rc > 0) {
    pendingWrite_ = 0;
    return {static_cast<size_t>(rc), Status::kOk};
  }
  Result r = finish(rc);
  if (r.status == Status::kWantWrite || r.status == Status::kWantRead) pendingWrite_ = n;
  return r;
}

bool Session::buffered() const {
  return SSL_pending(impl_->ssl) > 0 || (unannounced_ && SSL_has_pending(impl_->ssl));
}

void Session::writeAll(const void* src, size_t n, const Deadline& deadline) {
  auto* p = static_cast<const char*>(src);
  while (n > 0) {
    Result r = write(p, std::min(n, kMaxRecord));
    if (r.status == Status::kOk) {
      p += r.bytes;
      n -= r.bytes;
    } else if (r.status == Status::kClosed) {
      SHOAL_THROW(PeerError, "{}: connection lost while sending ({})", what_, closeReason_);
    } else {
      wait(r.status, deadline, "send");
    }
  }
}

void Session::readAll(void* dst, size_t n, const Deadline& deadline) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    Result r = read(p, n);
    if (r.status == Status::kOk) {
      p += r.bytes;
      n -= r.bytes;
    } else if (r.status == Status::kClosed) {
      SHOAL_THROW(
          PeerError, "{}: connection {}", what_,
          closeReason_ == "closed by peer" ? closeReason_ : fmt::format("lost ({})", closeReason_));
    } else {
      wait(r.status, deadline, "receive");
    }
  }
}

}  // namespace shoal::tls
