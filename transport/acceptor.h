// The one listener of a rank's world: a socket and a thread that complete incoming data
// connections for every group of the world at this rank (the world group and the groups split
// or connected from it), independently of the threads running their operations. A peer that
// needs a link dials it (transport/mesh.h); the rank's own threads may meanwhile compute, or
// wait in another group, and the connection is still made.
//
// For each incoming connection, the thread sends the HMAC challenge at once and gives the
// connection `handshakeTimeout` to send a complete hello; handshakes progress concurrently (at
// most 256 at once, the rest wait in the listen backlog), so a connection that sends nothing,
// garbage, a wrong proof or a hello for another rank is closed (and logged) without delaying
// any other. An authenticated hello is routed by its group id:
// - a registered group: its Mesh decides (Mesh::admit: accept, or refuse as "collision" or
//   "aborted"); an accepted one is set up on this thread (shared-memory offer or TLS server,
//   bounded by the group's timeout) and handed to the Mesh, which wakes its Endpoint;
// - a group that was registered and is gone (or whose creation failed here): refused as
//   "departed", so the dialer says "peer p left the group" at once, or as "aborted" when it
//   ended in an abort;
// - a group not registered yet: parked (at most 256, each at most `parkTimeout`) until it is:
//   a peer may finish creating a group and dial before this rank did.
// Refusals after an authenticated hello carry the acceptor's own proof (auth::answer).
//
// Threading: add()/remove()/address() are thread-safe. Ownership: shared (shared_ptr) by the
// groups of one world, passed explicitly; the destructor stops the thread and closes every
// connection it still holds (a parked dialer then sees its connection close). Errors on the
// thread never escape it: they fail the connection concerned and are logged.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/deadline.h"
#include "common/socket.h"
#include "transport/mesh.h"

namespace shoal::transport {

struct AcceptorOptions {
  std::string listenAddress = "127.0.0.1";
  std::string secret;
  // Per incoming connection: from accept to a complete hello.
  Duration handshakeTimeout = std::chrono::seconds(2);
  // An authenticated hello for a group not registered yet waits at most this long.
  Duration parkTimeout = std::chrono::seconds(60);
};

class Acceptor {
 public:
  // Listens on listenAddress (a free port) and starts the thread. Throws SystemError if it
  // cannot listen.
  explicit Acceptor(AcceptorOptions options);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  const HostPort& address() const { return address_; }

  // Routes hellos for mesh->plan().groupId to `mesh` from now on (parked ones included).
  // InvalidArgument if that id is registered already.
  void add(std::shared_ptr<Mesh> mesh);
  // The group is gone at this rank (or was never completed): its hellos are refused from now on
  // as departed, or as aborted if it ended in an abort. Idempotent.
  void remove(uint32_t groupId, bool aborted = false);

  // Hellos parked now; waits until at least `n` are, or the deadline (tests).
  size_t parked() const;
  bool waitParked(size_t n, const Deadline& deadline) const;

 private:
  struct Conn;
  void loop();
  void onHello(Conn& conn);
  // A hello that proved the secret, routed by group; false when its group is unknown here.
  bool route(Conn& conn);
  void reply(Conn& conn, const auth::Verdict& verdict);

  const AcceptorOptions options_;
  Fd listener_;
  HostPort address_;
  Fd wakeFd_;
  mutable std::mutex mutex_;
  std::map<uint32_t, std::shared_ptr<Mesh>> groups_;
  std::map<uint32_t, bool> departed_;   // gone here: whether aborted
  std::deque<uint32_t> departedOrder_;  // bounds departed_
  size_t parkedCount_ = 0;              // under mutex_, published by the thread after each round
  size_t parkedNow_ = 0;                // the thread's own count
  mutable std::condition_variable parkedChanged_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal::transport
