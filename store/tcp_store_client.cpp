#include <poll.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/hmac_auth.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {

TcpStore::TcpStore(HostPort address, Duration connectTimeout, std::string secret,
                   EncryptMode encrypt)
    : address_(std::move(address)),
      connectTimeout_(connectTimeout),
      secret_(std::move(secret)),
      encrypt_(encrypt) {}

namespace {

// A pooled connection the server has closed (idle limit, restart) reads as readable: EOF.
// Checking before reuse keeps a non-idempotent request off a connection that is already gone.
bool stillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

// Connects, authenticates and agrees on encryption. A refusal that stays true on retry (a wrong
// secret, conflicting encryption settings, a failed TLS handshake) is a StoreError.
TcpStore::Connection TcpStore::open(const Deadline& deadline, const std::string& what) {
  Connection c;
  c.fd = connectTcp(address_, deadline, what);
  const bool crossesHosts = !isLoopbackConnection(c.fd.get());
  try {
    const auto status =
        auth::connect(c.fd.get(), secret_, auth::Channel::kStore, 0, -1, -1, deadline, what);
    if (status == auth::GreetingStatus::kOpen) {
      // An unauthenticated store has no key: clear, unless this client insists.
      if (encrypt_ == EncryptMode::kOn) {
        SHOAL_THROW(StoreError,
                    "{}: SHOAL_ENCRYPT=on, but the store has no job secret to key TLS with (set "
                    "SHOAL_SECRET)",
                    what);
      }
      return c;
    }
    if (encryption::negotiate(c.fd.get(), encrypt_, crossesHosts, deadline, what)) {
      c.tls = std::make_unique<tls::Session>(c.fd.get(), tls::Session::Role::kClient,
                                             encryption::derivePsk(secret_, "store"), what);
      c.tls->handshake(deadline);
    }
  } catch (const ProtocolError& e) {
    // Not retried: a wrong secret or a conflicting setting stays so.
    SHOAL_THROW(StoreError, "{}", e.what());
  }
  return c;
}

std::vector<std::string> TcpStore::request(uint8_t cmd, const std::vector<std::string>& fields,
                                           const Deadline& deadline, bool idempotent) {
  const std::string what = fmt::format("store {}", address_.str());
  const std::string frame = wire::encode(cmd, fields);
  Connection conn_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    while (!idle_.empty() && !conn_.valid()) {
      Pooled p = std::move(idle_.back());
      idle_.pop_back();
      // (An encrypted connection is as quiet: the server sends no session tickets.)
      if (now - p.since < kMaxPooledIdle && stillOpen(p.conn.fd.get())) conn_ = std::move(p.conn);
    }
  }
  auto sendAll = [&](const void* data, size_t n) {
    if (conn_.tls) {
      conn_.tls->writeAll(data, n, deadline);
    } else {
      writeAll(conn_.fd.get(), data, n, deadline, what);
    }
  };
  auto receiveAll = [&](void* data, size_t n) {
    if (conn_.tls) {
      conn_.tls->readAll(data, n, deadline);
    } else {
      readAll(conn_.fd.get(), data, n, deadline, what);
    }
  };
  std::string lastError;
  while (!deadline.expired()) {
    bool sent = false;
    bool connected = conn_.valid();
    try {
      if (!connected) conn_ = open(deadline, what);
      connected = true;
      sendAll(frame.data(), frame.size());
      sent = true;
      uint32_t len = 0;
      receiveAll(&len, 4);
      if (len < 5 || len > wire::kMaxFrame) {
        SHOAL_THROW(ProtocolError, "{}: reply length {} is invalid", what, len);
      }
      std::string buf(4 + len, '\0');
      std::memcpy(buf.data(), &len, 4);
      receiveAll(buf.data() + 4, len);
      auto reply = wire::tryDecode(buf);
      if (!reply) SHOAL_THROW(ProtocolError, "{}: truncated reply", what);
      if (reply->code != wire::kOk) {
        // The connection stays in step (one reply per request): keep it for the next request.
        {
          std::lock_guard<std::mutex> lock(mutex_);
          idle_.push_back({std::move(conn_), Clock::now()});
        }
        SHOAL_THROW(StoreError, "{}: {}", what,
                    reply->fields.empty() ? std::string("request failed") : reply->fields[0]);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      idle_.push_back({std::move(conn_), Clock::now()});
      return std::move(reply->fields);
    } catch (const TimeoutError& e) {
      // A late reply would be taken for the next request's: start over on a new connection.
      conn_.reset();
      // The deadline ran out while connecting again after a refusal (a busy store): the
      // refusal, said below, tells more than the last attempt's timeout.
      if (!connected && !lastError.empty()) break;
      if (!connected) SHOAL_THROW(StoreError, "{} (store unreachable)", e.what());
      throw;
    } catch (const PeerError& e) {
      conn_.reset();
      lastError = e.what();
      // A non-idempotent request (add) that reached the server may have been applied.
      if (sent && !idempotent) SHOAL_THROW(StoreError, "{}: {}", what, lastError);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (const ProtocolError&) {
      conn_.reset();
      throw;
    }
  }
  SHOAL_THROW(StoreError, "{}: unreachable within {:.1f} s{}{}", what, deadline.timeoutSeconds(),
              lastError.empty() ? "" : ": ", lastError);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  request(wire::kSet, {key, value}, Deadline(connectTimeout_), true);
}

std::string TcpStore::get(const std::string& key, Duration timeout) {
  try {
    return request(wire::kGet, {key}, Deadline(timeout), true).at(0);
  } catch (const TimeoutError& e) {
    SHOAL_THROW(TimeoutError, "store {}: key '{}' did not appear within {:.1f} s", address_.str(),
                key, std::chrono::duration<double>(timeout).count());
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto r = request(wire::kAdd, {key, std::to_string(delta)}, Deadline(connectTimeout_), false);
  return parseCounter(key, r.at(0));
}

std::string TcpStore::compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) {
  return request(wire::kCompareSet, {key, expected, desired}, Deadline(connectTimeout_), false)
      .at(0);
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Deadline deadline(timeout);
  try {
    request(wire::kWait, keys, deadline, true);
  } catch (const TimeoutError&) {
    SHOAL_THROW(TimeoutError, "store {}: keys [{}] did not appear within {:.1f} s", address_.str(),
                joinKeys(keys), deadline.timeoutSeconds());
  }
}

bool TcpStore::deleteKey(const std::string& key) {
  return request(wire::kDelete, {key}, Deadline(connectTimeout_), true).at(0) == "1";
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return request(wire::kCheck, keys, Deadline(connectTimeout_), true).at(0) == "1";
}

}  // namespace shoal::store
