// An Endpoint is this rank's set of links to the peers of one group, and the progress loop
// that moves framed messages over them.
//
// Links are made on first use (transport/mesh.h): a transfer to or from a peer without a link
// makes run() dial that peer first (blocking, within the batch's deadline), or take the link the
// peer made from its side; the rest of the batch then progresses as usual. Dialing on a receive
// too means a rank waiting on a peer that aborted before they ever talked learns it at once
// (ConnectionLost naming the peer), and one whose peer destroyed the group gets "left the group".
//
// Contract:
// - Threading: one thread at a time calls run()/abort() (the group's executor). Not reentrant.
// - run() completes a batch of transfers. Transfers to the same peer in the same direction
//   complete in batch order; all others progress concurrently, so a batch may hold the send to
//   the right neighbour and the receive from the left one without deadlock. Buffers belong to
//   the caller and must stay valid until run() returns or throws.
// - run() blocks, never spins for long: shared-memory links spin for `spinTime` on the
//   doorbell, yield the core between looks for `yieldTime`, and then sleep on a futex; TCP and
//   TLS links are polled (epoll without sleeping) for `spinTime`, then between yields for
//   `yieldTime`, and then sleep in epoll_wait (a TLS link only once OpenSSL holds nothing its
//   socket would not announce: Note [Buffered bytes]).
// - run() throws TimeoutError at the deadline (naming the peers it still waits on),
//   ConnectionLost (a PeerError) when a peer's connection ends without a word, the error type of
//   a peer's abort frame (see receivedAbort()), Mismatch/ProtocolError for a bad frame. After a
//   throw the streams are out of step: the caller must abort() the endpoint, which tells every
//   peer (abort frame, then shutdown) so that all ranks fail fast instead of timing out.
//   Dialing throws what Mesh::dial() throws.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "common/types.h"
#include "transport/link.h"
#include "transport/mesh.h"
#include "transport/shm/segment.h"

namespace shoal::transport {

// What a receive-apply (Transfer::recvApply) hands its payload to, piece by piece as it arrives:
// an update kernel, a decoder. Kept to a function pointer and a context so that the transport
// stays generic (the layers above implement it) and a Transfer stays cheap to copy.
//
// Contract of fn(context, data, offset, bytes):
// - Called on the thread inside Endpoint::run(), in payload order, with consecutive pieces:
//   `data` holds the `bytes` bytes that start at byte `offset` of the payload. Every piece is a
//   whole number of `grain` bytes (never 0) and `data` is aligned to `grain`.
// - `data` is valid only during the call: on shared memory it points into the ring, which the
//   sender refills as soon as the call returns (zero-copy). Copy what must outlive the call.
// - Must not call into the Endpoint. An exception propagates out of run() like any failure
//   there (the payload is then partly consumed and the endpoint must be aborted).
struct PieceHandler {
  using Fn = void (*)(void* context, const void* data, size_t offset, size_t bytes);
  Fn fn = nullptr;
  void* context = nullptr;
  size_t grain = 1;  // a power of two, at most kMaxPieceGrain; the payload is a multiple of it
};
inline constexpr size_t kMaxPieceGrain = 16;

struct Transfer {
  enum class Kind : uint8_t { kSend, kRecv, kRecvReduce, kRecvApply };

  static Transfer send(int peer, const FrameHeader& h, const void* src) {
    Transfer t;
    t.kind = Kind::kSend;
    t.peer = peer;
    t.header = h;
    t.src = src;
    return t;
  }
  // Like send(), but only the first *ready payload bytes may go so far: for a payload produced
  // while the batch runs (by a receive-apply handler in the same batch, which advances *ready
  // up to h.bytes; nothing else may change it during run()). A reply can so stream out piece
  // by piece as the request it answers is consumed. A gate that never opens times out.
  static Transfer sendAsReady(int peer, const FrameHeader& h, const void* src,
                              const size_t* ready) {
    Transfer t = send(peer, h, src);
    t.ready = ready;
    return t;
  }
  static Transfer recv(int peer, const FrameHeader& expected, void* dst) {
    Transfer t;
    t.kind = Kind::kRecv;
    t.peer = peer;
    t.header = expected;
    t.dst = dst;
    return t;
  }
  // Reduces the incoming payload into dst (dst = dst op payload) as it arrives; with
  // divisor > 1 (sum and avg only) each result is also divided by it in the same pass
  // (common/reduce.h's reduceInto: a sum that ends in a division, such as an average's last
  // step, needs no second pass over dst).
  static Transfer recvReduce(int peer, const FrameHeader& expected, void* dst, DataType type,
                             ReduceOp op, int divisor = 1) {
    Transfer t = recv(peer, expected, dst);
    t.kind = Kind::kRecvReduce;
    t.dtype = type;
    t.redop = op;
    t.divisor = divisor;
    return t;
  }
  // Hands the incoming payload to `handler` as it arrives (see PieceHandler), instead of landing
  // it in a buffer: the receive-reduce path with a kernel of the caller's.
  static Transfer recvApply(int peer, const FrameHeader& expected, PieceHandler handler) {
    Transfer t = recv(peer, expected, nullptr);
    t.kind = Kind::kRecvApply;
    t.apply = handler;
    return t;
  }

  Kind kind = Kind::kSend;
  int peer = -1;
  FrameHeader header;  // send: written as is; receive: what must arrive (bytes = payload size)
  const void* src = nullptr;
  void* dst = nullptr;
  DataType dtype = DataType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  int divisor = 1;     // receive-reduce: each reduced element divided by it (see recvReduce)
  PieceHandler apply;  // receive-apply
  const size_t* ready = nullptr;  // sendAsReady
  // Index (in the same batch) of a transfer that must complete before this one starts: a ring
  // forwards segment k as soon as it has been received, while later segments still arrive.
  int after = -1;

  // Whether the Endpoint has moved all of it (a send: handed to the link, not yet received).
  bool complete() const {
    return kind == Kind::kSend ? done == sizeof(FrameHeader) + header.bytes
                               : headerDone == sizeof(FrameHeader) && done == header.bytes;
  }

  // Progress, owned by the Endpoint.
  size_t done = 0;  // send: header+payload bytes written; receive: payload bytes read
  size_t headerDone = 0;
  size_t carry = 0;  // receive-reduce / receive-apply: bytes staged but not yet consumed
  FrameHeader got{};
};

struct EndpointOptions {
  Duration spinTime = std::chrono::microseconds(5);
  Duration yieldTime = std::chrono::microseconds(50);
  // run() calls onSlow once when a batch has been blocked longer than slowAfter (used to
  // publish diagnostics only on the slow path).
  Duration slowAfter = std::chrono::seconds(1);
  // Names frames in error messages (the layer that defines the operation codes knows them).
  FrameDescriber describe = describeFrame;
};

class Acceptor;

class Endpoint {
 public:
  // Every link given up front (tests): links[peer] is null for this rank and for peers it will
  // never talk to. ownBell is this rank's doorbell segment (null if no link is shared-memory).
  Endpoint(int rank, int size, std::vector<std::unique_ptr<Link>> links,
           std::shared_ptr<shm::Segment> ownBell, EndpointOptions options);
  // Links made on first use through `mesh`; registers it with `acceptor` (which then hands this
  // endpoint the links peers make) until destruction.
  Endpoint(std::shared_ptr<Mesh> mesh, std::shared_ptr<Acceptor> acceptor, EndpointOptions options);
  // Unregisters from the acceptor (peers that dial later hear "departed") and, unless aborted,
  // says goodbye to every connected peer: a peer that sees this end close while it still waits
  // on others must not take it for a crash.
  ~Endpoint();

  // With `firstArrival` holding no time yet (Clock::time_point{}), sets it to when this call
  // first read a frame header of one of its receives in full: when a peer's message was first
  // there (traces: Note [Operation spans] in comm/group.cpp). Null costs a branch per frame.
  void run(Transfer* transfers, size_t count, const Deadline& deadline,
           const std::function<void()>& onSlow = {}, Clock::time_point* firstArrival = nullptr);

  // Like run(), but also returns (false) when `stopEarly` says so after a wake() or a quiet
  // spell, with every transfer's progress kept in it: call again with the same transfers first
  // (same order) and new ones appended. For a progress thread that takes new work while old
  // work is still moving (point-to-point channels). Returns true when all completed.
  // stopEarly is given the time of the look (one clock read serves the loop's checks).
  bool runUntil(Transfer* transfers, size_t count, const Deadline& deadline,
                const std::function<bool(Clock::time_point now)>& stopEarly);

  // One attempt at a lone send or plain receive on a link that is already up, without a
  // batch's set-up or a clock read (a receive on shared memory watches its ring for a short
  // spin first: Note [Waiting before the set-up] in the .cpp): true when it completed. Otherwise
  // (false) the transfer keeps whatever progress it made, to be passed on to run() or runUntil() as
  // their first transfer; receives of other kinds, and links not made yet, always go there. Throws
  // as run() does. For the direct path of blocking point-to-point (Note [Direct path] in
  // comm/native/p2p_channel.cpp).
  bool tryNow(Transfer& t);

  // Thread-safe: makes a runUntil() blocked in another thread look at stopEarly() at once.
  void wake() noexcept;

  // Best effort, never throws: sends an abort frame carrying `failure` to every peer that can
  // take one without corrupting a half-written frame, then shuts every link down. A peer in the
  // middle of a frame only sees the connection close (Group tells it why through the store).
  void abort(const Failure& failure) noexcept;
  bool aborted() const { return aborted_; }
  // Bytes of frames (headers and payloads) this endpoint has handed to its links so far, for
  // reports of what a step sent. Thread-safe.
  uint64_t bytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }

  // The one call that may come from another thread while run() blocks: shuts every link's
  // socket down and stops a dial in progress (or the wait for a peer's link), so that run()
  // fails at once with PeerError and the peers see the connection close; later dials fail too.
  // For stopping a thread that waits on a peer which will never send.
  void interrupt() noexcept;
  const std::string& abortReason() const { return abortReason_; }

  // The Failure of the last abort frame a peer sent (what run() threw for), if any.
  const std::optional<Failure>& receivedAbort() const { return receivedAbort_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The kind the link to `peer` has, or will have once made (planned from the peers' records
  // and the options; set-up fails rather than make another kind). Thread-safe.
  LinkKind linkKind(int peer) const { return mesh_->plan().kinds.at(peer); }
  // Whether the link to `peer` is made (or being handed over by the acceptor). Thread-safe.
  bool connected(int peer) const { return mesh_->connected(peer); }
  int connectedPeers() const { return mesh_->connectedCount(); }
  // The pairs' state and counters (tests, diagnostics). Thread-safe.
  const Mesh& mesh() const { return *mesh_; }

 private:
  void init();
  // The link to `peer`, made now if it is not yet (Mesh::dial).
  void connect(int peer, const Deadline& deadline, const std::function<void()>& onSlow);
  // Takes the links the acceptor made; `watch` adds them to the epoll set.
  void adoptArrivals(bool watch);
  void install(int peer, std::unique_ptr<Link> link, bool watch);
  bool progress(Transfer* transfers, size_t count, const Deadline& deadline,
                const std::function<void()>& onSlow,
                const std::function<bool(Clock::time_point)>& stopEarly,
                Clock::time_point* firstArrival);
  bool advanceSend(Transfer& t);
  bool advanceRecv(Transfer& t, Clock::time_point* firstArrival);
  // Receive-reduce and receive-apply: moves what has arrived of t's payload to `consume`
  // (src, payload offset, bytes: whole elements of `esize`), zero-copy out of a shared ring when
  // it can. Returns the payload bytes taken from the link.
  template <typename Consume>
  size_t recvPiecesSome(Transfer& t, Link& link, size_t esize, const Consume& consume);
  [[noreturn]] void readAbortFrame(int peer, const FrameHeader& h);
  void checkSocket(int peer);
  void sendControl(int peer, FrameHeader h, const std::string& text) noexcept;
  [[noreturn]] void throwDeparted(int peer, const FrameHeader& expected);
  // Returns how many sockets (or the wake-up) epoll reported.
  int pollSockets(int timeoutMs, const std::vector<char>& recvPending);
  [[noreturn]] void throwTimeout(const Transfer* transfers, size_t count, const Deadline& deadline);

  int rank_;
  int size_;
  // Written only by the run thread, under installMutex_ (interrupt() reads it from another).
  std::vector<std::unique_ptr<Link>> links_;
  std::mutex installMutex_;
  std::shared_ptr<Mesh> mesh_;  // its wakeFd() is in epoll_, for wake() and arriving links
  std::shared_ptr<Acceptor> acceptor_;
  uint64_t arrivalsSeen_ = 0;
  std::shared_ptr<shm::Segment> ownBell_;
  EndpointOptions options_;
  Fd epoll_;
  std::vector<std::vector<uint8_t>> staging_;
  std::vector<char> midFrame_;  // a send to this peer stopped inside a frame
  std::vector<char> departed_;  // the peer said goodbye

  // Per-run scratch, kept to spare the latency path its allocations: one FIFO of transfer
  // indices per (peer, direction); only a queue's front transfer can move.
  struct Queue {
    int peer = 0;
    bool send = false;
    std::vector<size_t> items;
    size_t front = 0;
  };
  std::vector<Queue> queues_;
  std::vector<char> finished_;
  std::vector<char> recvBlocked_;
  bool aborted_ = false;
  std::atomic<uint64_t> bytesSent_{0};
  std::string abortReason_;
  std::optional<Failure> receivedAbort_;
};

}  // namespace shoal::transport
