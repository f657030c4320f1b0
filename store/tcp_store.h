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

#include "common/socket.h"
#include "store/store.h"

namespace shoal::store {

// What one server accepts. Every limit is enforced by the server; a request over one gets a
// one-line error naming the limit (StoreError on the client) and the server keeps serving.
struct TcpStoreServerOptions {
  // The job secret every client must prove. Empty: unauthenticated (see above).
  std::string secret;
  size_t maxKeyBytes = 4096;
  size_t maxValueBytes = 1u << 20;     // a set / compareSet value
  size_t maxStoredBytes = 256u << 20;  // keys + values held in all
  int maxConnections = 1024;           // beyond it a new connection is greeted "busy" and closed
  int maxParked = 4096;                // get / wait requests waiting for keys, over all clients
  // A connection must finish the handshake within this, else it is closed (a port scanner, a
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
  // Throws SystemError if the address cannot be bound, InvalidArgument for a limit of 0.
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
  // connection first proves `secret` (empty: only an unauthenticated server is accepted).
  // Thread-safe; concurrent calls use separate connections.
  // `connectTimeout` bounds calls that take no timeout of their own (set, add, ...).
  // Errors: StoreError naming the address when the store is unreachable, refuses the request
  // (a limit) or the authentication ("authentication failed: wrong job secret?"), which is
  // never retried; TimeoutError from get / wait when the keys do not appear in time.
  TcpStore(HostPort address, Duration connectTimeout, std::string secret = {});

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
  std::vector<std::string> request(uint8_t cmd, const std::vector<std::string>& fields,
                                   const Deadline& deadline, bool idempotent);

  std::unique_ptr<TcpStoreServer> server_;  // destroyed last: after the connections below
  HostPort address_;
  Duration connectTimeout_;
  std::string secret_;
  // Idle connections. A request takes one (or opens one) for its whole exchange, so a get()
  // parked on the server never holds up another thread's set().
  struct Pooled {
    Fd fd;
    Clock::time_point since;
  };
  std::mutex mutex_;
  std::vector<Pooled> idle_;
};

}  // namespace shoal::store
