#include "common/tls_client.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "common/openssl_socket.h"
#include "common/socket.h"

namespace shoal::tls {

namespace {

bool isIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

struct ClientContext::Impl {
  SSL_CTX* ctx = nullptr;
  ~Impl() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
};

ClientContext::ClientContext(const ClientOptions& o) : impl_(std::make_unique<Impl>()) {
  ERR_clear_error();
  impl_->ctx = SSL_CTX_new(TLS_client_method());
  if (impl_->ctx == nullptr) SHOAL_THROW(SystemError, "TLS client: {}", sslReason());
  SSL_CTX* ctx = impl_->ctx;
  if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)) {
    SHOAL_THROW(SystemError, "TLS client: {}", sslReason());
  }
  // Nothing is resumed: each connection is a full handshake, verified again.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!o.caFile.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, o.caFile.c_str(), nullptr) != 1) {
      SHOAL_THROW(InvalidArgument, "TLS CA file {}: {}", o.caFile, sslReason());
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    SHOAL_THROW(SystemError, "TLS client: the system's trust store: {}", sslReason());
  }
  if (o.certFile.empty() != o.keyFile.empty()) {
    SHOAL_THROW(InvalidArgument,
                "a TLS client certificate needs its key, and a key its certificate");
  }
  if (!o.certFile.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, o.certFile.c_str()) != 1) {
      SHOAL_THROW(InvalidArgument, "TLS client certificate {}: {}", o.certFile, sslReason());
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, o.keyFile.c_str(), SSL_FILETYPE_PEM) != 1) {
      SHOAL_THROW(InvalidArgument, "TLS client key {}: {}", o.keyFile, sslReason());
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      SHOAL_THROW(InvalidArgument, "TLS client key {} does not match certificate {}: {}", o.keyFile,
                  o.certFile, sslReason());
    }
  }
}

ClientContext::~ClientContext() = default;

struct ClientConnection::Impl {
  SSL* ssl = nullptr;
  ~Impl() {
    if (ssl != nullptr) SSL_free(ssl);  // frees its BIO too
  }
};

ClientConnection::ClientConnection(std::shared_ptr<const ClientContext> context, int fd,
                                   const std::string& host, std::string what)
    : context_(std::move(context)),
      impl_(std::make_unique<Impl>()),
      fd_(fd),
      what_(std::move(what)) {
  ERR_clear_error();
  // SSL_new only reads the context (and takes a reference): safe from many threads.
  impl_->ssl = SSL_new(context_->impl_->ctx);
  if (impl_->ssl == nullptr) SHOAL_THROW(SystemError, "{}: TLS: {}", what_, sslReason());
  SSL* ssl = impl_->ssl;
  BIO* bio = newSocketBio(fd);
  if (bio == nullptr) SHOAL_THROW(SystemError, "{}: TLS: {}", what_, sslReason());
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO
  // The name the certificate must carry: checked by OpenSSL's chain verification, so a
  // mismatch fails the handshake like an untrusted chain does.
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (isIpLiteral(host)) {
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) {
      SHOAL_THROW(InvalidArgument, "{}: TLS: '{}' is not a usable IP address", what_, host);
    }
  } else {
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (SSL_set1_host(ssl, host.c_str()) != 1 || SSL_set_tlsext_host_name(ssl, host.c_str()) != 1) {
      SHOAL_THROW(InvalidArgument, "{}: TLS: '{}' is not a usable host name", what_, host);
    }
  }
  SSL_set_connect_state(ssl);
}

ClientConnection::~ClientConnection() = default;

void ClientConnection::waitOrThrow(int rc, const Deadline& deadline, const char* doing) {
  SSL* ssl = impl_->ssl;
  const int err = SSL_get_error(ssl, rc);
  short events = 0;
  if (err == SSL_ERROR_WANT_READ) {
    events = POLLIN;
  } else if (err == SSL_ERROR_WANT_WRITE) {
    events = POLLOUT;
  } else if (err == SSL_ERROR_SSL &&
             ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    // The stream ended without the server's close_notify: what was read may be cut short.
    ERR_clear_error();
    SHOAL_THROW(PeerError, "{}: the connection ended without a TLS close {}", what_, doing);
  } else if (err == SSL_ERROR_SSL) {
    std::string reason = sslReason();
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      reason += fmt::format(": {}", X509_verify_cert_error_string(verify));
    }
    SHOAL_THROW(ProtocolError, "{}: TLS: {}", what_, reason);
  } else if (err == SSL_ERROR_ZERO_RETURN) {
    SHOAL_THROW(PeerError, "{}: the server closed the connection {}", what_, doing);
  } else {  // SSL_ERROR_SYSCALL: the socket failed (reset) or ended without a TLS alert
    const int e = errno;
    ERR_clear_error();
    SHOAL_THROW(PeerError, "{}: connection lost {}: {}", what_, doing,
                e != 0 ? std::strerror(e) : "closed");
  }
  if (!pollFor(fd_, events, deadline)) {
    SHOAL_THROW(TimeoutError, "{}: timed out after {:.1f} s {}", what_, deadline.timeoutSeconds(),
                doing);
  }
}

void ClientConnection::handshake(const Deadline& deadline) {
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_do_handshake(impl_->ssl);
    if (rc == 1) return;
    waitOrThrow(rc, deadline, "in the TLS handshake");
  }
}

void ClientConnection::writeAll(const void* data, size_t n, const Deadline& deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    size_t written = 0;
    ERR_clear_error();
    errno = 0;
    // A write that wants to wait is repeated with the same bytes, as OpenSSL requires.
    // SSL_write_ex takes the whole size_t count (SSL_write's int would need a cap); a success
    // wrote all of it unless partial writes were enabled, which the loop also handles.
    const int rc = SSL_write_ex(impl_->ssl, p, n, &written);
    if (rc == 1) {
      p += written;
      n -= written;
      continue;
    }
    waitOrThrow(rc, deadline, "writing the request");
  }
}

size_t ClientConnection::read(void* data, size_t n, const Deadline& deadline) {
  while (true) {
    size_t got = 0;
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_read_ex(impl_->ssl, data, n, &got);
    if (rc == 1) return got;
    if (SSL_get_error(impl_->ssl, rc) == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
    waitOrThrow(rc, deadline, "reading the reply");
  }
}

}  // namespace shoal::tls
