// One group's links at one rank, made on first use: the state each pair is in, shared by the
// rank's Endpoint (which dials) and its Acceptor thread (which accepts), and the links the
// acceptor made, waiting for the Endpoint to take them.
//
// A pair's link is made once, by whichever end needs it first (a send or a receive to the
// other): that end dials the other's acceptor. Both ends may dial at once; exactly one
// connection survives (Note [Simultaneous dial] in mesh.cpp).
//
// Contract:
// - Threading: dial(), takeArrivals() come from the Endpoint's run thread (one at a time);
//   admit(), deliver(), failed() from the acceptor's thread; interrupt(), markAborted(),
//   close(), wake(), connected() from any thread. All state is under one mutex; dial() never
//   holds it while it blocks.
// - Ownership: the Mesh is shared (shared_ptr) by the Endpoint and the Acceptor, so a link the
//   acceptor finishes after the Endpoint went has somewhere to go (it is told goodbye and closed).
// - Blocking: dial() blocks up to its deadline; the acceptor's half of a set-up is bounded by
//   the plan's timeout.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/hmac_auth.h"
#include "transport/link_setup.h"

namespace shoal::transport {

class Mesh {
 public:
  // `plan.peers` empty: a mesh whose links are all given up front (no dialing).
  explicit Mesh(LinkPlan plan);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const LinkPlan& plan() const { return plan_; }
  // A link made outside (an Endpoint given its links up front): the pair counts as connected.
  void adopt(int peer);

  // ---- the Endpoint's side

  // The link to `peer`, made now: dials the peer's acceptor, authenticates, and runs the dialing
  // half of the set-up. Returns it, or null when the link comes from the other end instead (a
  // simultaneous dial the peer won, or one the acceptor took first): it is then among
  // takeArrivals(). Throws, naming the peer: PeerError "left the group" when the peer's group
  // was destroyed, ConnectionLost when the peer aborted it or is gone (nothing listens), PeerError
  // after interrupt(), TimeoutError at the deadline, and what the set-up throws (on either end:
  // the acceptor's error is rethrown here). A failure is final for the pair: a later dial()
  // throws it again.
  // `onSlow` (if set) is called once when the dial has waited `slowAfter` (the peer's acceptor
  // has not answered, or the link from the other end has not come): the caller's "blocked"
  // diagnostics (transport::EndpointOptions::slowAfter).
  std::unique_ptr<Link> dial(int peer, const Deadline& deadline,
                             const std::function<void()>& onSlow = {},
                             Duration slowAfter = std::chrono::seconds(1));

  // Links the acceptor finished since the last call, with their peers.
  std::vector<std::pair<int, std::unique_ptr<Link>>> takeArrivals();
  // Counts deliveries; cheap to poll (changes when takeArrivals() has something new).
  uint64_t arrivals() const { return arrivalCount_.load(std::memory_order_acquire); }

  // Readable when a link arrived or the mesh was interrupted (an eventfd; wake() writes it too).
  int wakeFd() const { return wakeFd_.get(); }
  // Writes wakeFd() and rings this rank's doorbell.
  void wake() noexcept;

  // Whether the pair with `peer` is connected (or its link is about to be handed over).
  bool connected(int peer) const;
  int connectedCount() const;
  // Blocks until the pair with `peer` is connected (true), failed, or the deadline (false).
  bool waitConnected(int peer, const Deadline& deadline) const;
  // Hellos this rank sent, and how many of them the peer refused as a collision (tests, logs).
  uint64_t dials() const { return dials_.load(); }
  uint64_t collisions() const { return collisions_.load(); }

  // A dial in progress fails at once, later ones too; the acceptor refuses this group's peers
  // as aborted from now on.
  void interrupt() noexcept;
  bool interrupted() const { return interrupted_.load(std::memory_order_acquire); }
  // The acceptor refuses this group's peers as aborted from now on.
  void markAborted() noexcept;
  // The group is gone at this rank: the acceptor refuses its peers as departed, and a link it
  // still finishes is told goodbye and closed.
  void close() noexcept;

  // ---- the acceptor's side

  // Whether to accept a hello from `from` (authenticated, for this group and rank): kAccepted
  // (the pair is now being accepted), or kCollision / kAborted / kDeparted.
  auth::VerdictCode admit(int from);
  // The accepted pair's link is ready, or its set-up failed (`why`).
  void deliver(int from, std::unique_ptr<Link> link) noexcept;
  void failed(int from, std::exception_ptr error) noexcept;

 private:
  enum class State : uint8_t { kNone, kDialing, kAccepting, kConnected, kFailed };
  // One attempt: connect, authenticate, and on kAccepted the dialing half of the set-up.
  // `slow` (if set) is called when the greeting has not come by `slowAt`.
  auth::VerdictCode attempt(int peer, const Deadline& deadline, std::unique_ptr<Link>* link,
                            const std::function<void()>* slow, Clock::time_point slowAt);
  [[noreturn]] void throwFailure(int peer);
  void wakeLocked() noexcept;

  const LinkPlan plan_;
  Fd wakeFd_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::atomic<uint64_t> dials_{0};
  std::atomic<uint64_t> collisions_{0};
  std::vector<State> state_;
  std::vector<std::exception_ptr> failure_;  // why the pair failed (State::kFailed)
  std::vector<std::pair<int, std::unique_ptr<Link>>> arrived_;
  std::atomic<uint64_t> arrivalCount_{0};
  Fd dialHandle_;  // a dup of the socket being dialed, for interrupt() to shut down
  std::atomic<bool> interrupted_{false};
  bool aborted_ = false;
  bool closed_ = false;
};

}  // namespace shoal::transport
