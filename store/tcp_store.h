// TCP store: a small server any rank or the launcher can host, and a client.
//
// Wire format (both directions): u32 length of the rest, u8 command/status, u32 field count,
// then each field as u32 length + bytes. Frames over 64 MiB or with inconsistent lengths are
// rejected and the offending client is disconnected (the server keeps serving the others).
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

class TcpStoreServer {
 public:
  // Listens on host:port (0 = pick a free port; see port()). Serves on a background thread
  // until destroyed. Throws SystemError if the address cannot be bound.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();

  Fd listen_;
  Fd wakeRead_;
  Fd wakeWrite_;
  int port_ = 0;
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  // Connects lazily and reconnects on failure, retrying within each call's deadline.
  // Thread-safe; concurrent calls use separate connections.
  // `connectTimeout` bounds calls that take no timeout of their own (set, add, ...).
  TcpStore(HostPort address, Duration connectTimeout);

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
  // Idle connections. A request takes one (or opens one) for its whole exchange, so a get()
  // parked on the server never holds up another thread's set().
  std::mutex mutex_;
  std::vector<Fd> idle_;
};

}  // namespace shoal::store
