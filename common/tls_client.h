// A certificate-verifying TLS client over a connected, non-blocking TCP socket: for servers
// that are not part of the job and present an X.509 certificate (etcd started with
// --cert-file/--key-file). The job's own links use common/tls.h instead (PSK, no certificates).
//
// What is verified: the server's certificate chain up to a trusted CA (the CA file given, else
// the system's default trust store) and that the certificate names the host connected to (a
// DNS name against its subject alternative names, wildcards only as a whole left-most label;
// an IP literal against its IP address SANs). TLS 1.2 at least. Host names are sent as SNI. A
// client certificate and key, when given, are offered to a server that asks for one
// (etcd's --client-cert-auth).
//
// Ownership: a ClientContext holds the loaded certificates (read once, when it is built) and is
// shared by the connections made with it (shared_ptr). A ClientConnection borrows the socket:
// its owner closes the socket after destroying the connection.
//
// Threading: a ClientContext may be used by any number of threads at once once built; a
// ClientConnection by one thread at a time. Nothing here installs a signal handler: writes use
// send(MSG_NOSIGNAL).
//
// Blocking and timeouts: every call that waits takes a Deadline and waits with poll(2) on the
// socket for the readiness OpenSSL asks for (never spinning); TimeoutError naming `what` when
// the deadline passes first.
//
// Errors, each one line naming `what`:
// - InvalidArgument: a CA, certificate or key file that cannot be loaded, a key that does not
//   match its certificate (from the ClientContext).
// - ProtocolError "<what>: TLS: <reason>": the handshake or a record failed; for a certificate
//   the client refused, "certificate verify failed: <why>" (e.g. "self-signed certificate in
//   certificate chain", "IP address mismatch"); for a server that refused this client, its
//   alert ("tlsv13 alert certificate required").
// - PeerError: the connection closed or was reset mid-handshake or mid-write.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/deadline.h"

namespace shoal::tls {

struct ClientOptions {
  std::string caFile;    // PEM CA certificates to trust; empty: the system's default store
  std::string certFile;  // PEM client certificate (chain); empty: none
  std::string keyFile;   // PEM private key of certFile; given exactly when certFile is
};

class ClientContext {
 public:
  // Loads the files now. InvalidArgument (one line, naming the file and OpenSSL's reason) when
  // one cannot be used; SystemError if OpenSSL fails otherwise.
  explicit ClientContext(const ClientOptions& options);
  ~ClientContext();
  ClientContext(const ClientContext&) = delete;
  ClientContext& operator=(const ClientContext&) = delete;

 private:
  friend class ClientConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ClientConnection {
 public:
  // `fd`: a connected non-blocking socket to `host` (a DNS name or an IP literal: what the
  // certificate must name). `what` names the connection in errors ("etcd store 10.0.0.1:2379").
  ClientConnection(std::shared_ptr<const ClientContext> context, int fd, const std::string& host,
                   std::string what);
  ~ClientConnection();
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  // The handshake, verification included.
  void handshake(const Deadline& deadline);
  // All n bytes.
  void writeAll(const void* data, size_t n, const Deadline& deadline);
  // At least one byte and at most n; 0 when the server closed the connection (its close_notify,
  // or the end of the stream: the caller checks that what it read is complete).
  size_t read(void* data, size_t n, const Deadline& deadline);

 private:
  // Waits for what the failed call `rc` of SSL_* asks for; throws for anything else. `doing`
  // ends the errors' text: "in the TLS handshake".
  void waitOrThrow(int rc, const Deadline& deadline, const char* doing);

  std::shared_ptr<const ClientContext> context_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int fd_;
  std::string what_;
};

}  // namespace shoal::tls
