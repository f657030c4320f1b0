// TCP store: a small server any rank or the launcher can host, and a client.
//
// Connection: the server speaks first (common/hmac_auth.h). With a job secret it challenges the
// client, which must prove the secret (HMAC, channel kStore) before the server reads a single
// request; a client that fails is told so and closed, and the server keeps serving the others.
// A server without a secret greets with "open" and serves anyone who can reach its port: only
// for in-process tests and jobs that have no secret at all (Slurm / Kubernetes without
// SHOAL_SECRET, where the generated secret travels through the store itself). A client holding a
// secret refuses an open server (it could be an impostor), and a client without one gets a
// StoreError from a server that requires one.
//
// Encryption (common/encryption.h): after a successful handshake each end sends its offer and
// reads the other's; when they agree to encrypt, the client runs a TLS 1.3 handshake keyed from
// the secret (purpose "store") and every request and reply travels in TLS records. auto
// encrypts a connection unless both of its ends are loopback addresses: a store reached on
// 127.0.0.1 by ranks of its own host stays in clear, one reached across hosts is encrypted. The
// server drives each TLS handshake in its event loop, bounded by the handshake deadline like the
// HMAC handshake, so one slow client never delays the others. An unauthenticated store (no
// secret) has no key and never encrypts: a client that requires encryption refuses it, and a
// server set to SHOAL_ENCRYPT=on refuses to start without a secret.
//
// Requests (both directions): u32 length of the rest, u8 command/status, u32 field count, then
// each field as u32 length + bytes. A frame longer than the server's limit is answered with an
// error and its bytes are discarded unread (never buffered); malformed frames disconnect the
// client.
//
// Blocking requests (get, wait) park on the server until the keys exist; the client enforces
// its own deadline and drops the connection when it passes, which removes the parked request.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "common/encryption.h"
#include "common/socket.h"
#include "common/tls.h"
#include "store/store.h"

namespace shoal::store {

// What one server accepts. Every limit is enforced by the server; a request over one gets a
// one-line error naming the limit (StoreError on the client) and the server keeps serving.
struct TcpStoreServerOptions {
  // The job secret every client must prove. Empty: unauthenticated (see above).
  std::string secret;
  // When to encrypt a client's connection (see above); on needs a secret.
  EncryptMode encrypt = EncryptMode::kAuto;
  size_t maxKeyBytes = 4096;
  size_t maxValueBytes = 1u << 20;     // a set / compareSet value
  size_t maxStoredBytes = 256u << 20;  // keys + values held in all
  int maxConnections = 1024;           // beyond it a new connection is greeted "busy" and closed
  int maxParked = 4096;                // get / wait requests waiting for keys, over all clients
  // A connection must finish the handshake (HMAC, and TLS when encrypted) within this, else it
  // is closed (a port scanner, a
  // health check or a stalled client never holds a slot for long).
  Duration handshakeTimeout = std::chrono::seconds(5);
  // An authenticated connection that sends nothing and has no parked request for this long is
  // closed. Must exceed TcpStore's pooled-connection lifetime (kMaxPooledIdle).
  Duration idleTimeout = std::chrono::seconds(120);
};

class TcpStoreServer {
 public:
  // Listens on host:port (0 = pick a free port; see port()); host is the address the job's
  // clients use (0.0.0.0 only when every interface is meant). Serves on a background thread
  // until destroyed; the destructor wakes it and joins (closing every client connection).
  // Throws SystemError if the address cannot be bound, InvalidArgument for a limit of 0 or for
  // encrypt = on without a secret.
  TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Client connections currently open (authenticated or still in the handshake). Thread-safe;
  // for tests and diagnostics.
  int connections() const { return connections_.load(); }
  // Bytes of keys and values currently stored. Thread-safe.
  size_t storedBytes() const { return storedBytes_.load(); }

 private:
  void serve();

  TcpStoreServerOptions options_;
  Fd listen_;
  Fd wakeRead_;
  Fd wakeWrite_;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::atomic<size_t> storedBytes_{0};
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  // A pooled connection unused for longer than this is closed rather than reused, so the
  // server's idle limit (TcpStoreServerOptions::idleTimeout) never closes one under a request.
  static constexpr Duration kMaxPooledIdle = std::chrono::seconds(30);

  // Connects lazily and reconnects on failure, retrying within each call's deadline; every new
  // connection first proves `secret` (empty: only an unauthenticated server is accepted), then
  // agrees on encryption with the server (`encrypt`, see above).
  // Thread-safe; concurrent calls use separate connections.
  // `connectTimeout` bounds calls that take no timeout of their own (set, add, ...).
  // Errors: StoreError naming the address when the store is unreachable, refuses the request
  // (a limit), the authentication ("authentication failed: wrong job secret?") or the encryption
  // (conflicting settings, a failed TLS handshake), which are never retried; TimeoutError from
  // get / wait when the keys do not appear in time.
  TcpStore(HostPort address, Duration connectTimeout, std::string secret = {},
           EncryptMode encrypt = EncryptMode::kAuto);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const HostPort& address() const { return address_; }

  // Keeps `server` running as long as this client lives (for the rank that hosts the store, so
  // the store lives exactly as long as the groups that use it).
  void keepServer(std::unique_ptr<TcpStoreServer> server) { server_ = std::move(server); }

 private:
  // One connection: the socket, and its TLS session when encrypted.
  struct Connection {
    Fd fd;
    std::unique_ptr<tls::Session> tls;
    bool valid() const { return fd.valid(); }
    void reset() {
      tls.reset();
      fd.reset();
    }
  };

  std::vector<std::string> request(uint8_t cmd, const std::vector<std::string>& fields,
                                   const Deadline& deadline, bool idempotent);
  Connection open(const Deadline& deadline, const std::string& what);

  std::unique_ptr<TcpStoreServer> server_;  // destroyed last: after the connections below
  HostPort address_;
  Duration connectTimeout_;
  std::string secret_;
  EncryptMode encrypt_;
  // Idle connections. A request takes one (or opens one) for its whole exchange, so a get()
  // parked on the server never holds up another thread's set().
  struct Pooled {
    Connection conn;
    Clock::time_point since;
  };
  std::mutex mutex_;
  std::vector<Pooled> idle_;
};

}  // namespace shoal::store
