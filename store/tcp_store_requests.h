// What the TCP store's server does with an authenticated client's bytes (tcp_store.h has the
// format): decodes its frames, answers each from the key-value data it holds, parks a get or a
// wait whose keys are missing, and answers a request over a limit with an error instead of
// dropping the connection. No sockets, TLS or clocks: TcpStoreServer (tcp_store_server.cpp)
// moves bytes between those and a RequestStream, and the fuzz target store_requests drives the
// same code with bytes alone.
//
// Thread-safety: none; the server's one thread owns a StoreRequests and every stream it serves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {

// One client's side of the conversation.
struct RequestStream {
  std::string in;     // bytes received and not yet served
  std::string out;    // replies not yet sent
  uint64_t skip = 0;  // bytes of an over-limit frame still to discard unread
  // A get or wait waiting for its keys. Requests on one connection are served in order, so
  // while one is parked the client's later requests wait in `in`.
  std::optional<wire::Message> parked;
};

class StoreRequests {
 public:
  // Enforces o's key, value, stored-bytes and parked-request limits (the rest of o is the
  // server's).
  explicit StoreRequests(const TcpStoreServerOptions& o);

  // The longest request frame accepted: what the key and value limits allow.
  uint32_t maxFrame() const { return maxFrame_; }
  size_t storedBytes() const { return stored_; }
  // Parked requests over every stream.
  int parkedCount() const { return parked_; }

  // Serves s's parked request if its keys now exist, then as many whole frames of s.in as
  // possible, appending the replies to s.out. Stops at a request that must park, and while
  // s.out holds maxFrame() bytes or more (a client that does not read its replies is not
  // served, so its replies stay bounded). Throws ProtocolError for a malformed frame or an
  // unknown command: the caller drops the client, after forget().
  void drain(RequestStream& s);
  // The client is going away: its parked request, if any, is forgotten.
  void forget(RequestStream& s);

 private:
  // Handles one request; false if it must park until its keys appear.
  bool handle(RequestStream& s, const wire::Message& m);
  void fail(RequestStream& s, const std::string& why);
  // Each checks a limit; false (with a reply) when over.
  bool keyOk(RequestStream& s, const std::string& key);
  bool valueOk(RequestStream& s, const std::string& key, const std::string& value);
  // Stores key = value if the total stays within the limit; false (with a reply) otherwise.
  bool put(RequestStream& s, const std::string& key, const std::string& value);

  const size_t maxKeyBytes_;
  const size_t maxValueBytes_;
  const size_t maxStoredBytes_;
  const int maxParked_;
  const uint32_t maxFrame_;
  std::map<std::string, std::string> data_;
  size_t stored_ = 0;
  int parked_ = 0;
};

}  // namespace shoal::store
