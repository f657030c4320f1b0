// One point-to-point channel: the messages between this rank and one peer with one tag, both
// directions, on a connection of their own.
//
// Why a connection of its own: point-to-point must not wait behind the group's collectives, and
// messages with different tags must not wait behind each other (a pipeline's activations and
// gradients). The channel's two-rank group is made lazily, on first use between the pair
// (Group::connect), so a grid of groups pays only for the pairs that talk.
//
// How: the channel's connection is moved by one thread at a time, the *driver*. Posted sends
// and receives are taken in post order, each direction gets consecutive sequence numbers (the
// k-th send is the k-th receive on the other side; count and type must agree, MismatchError
// otherwise), and all of them move at once with transport::Endpoint::runUntil, taking newly
// posted work whenever the transfers in flight wait: two ranks sending large messages to each
// other both ways never deadlock, since the driver also takes the receive.
// Who drives (Note [Who drives]): the posting thread makes one non-blocking attempt at once; a
// thread waiting on a Work of the channel drives until that work completes; a worker thread
// drives whenever work is left and nobody has driven for kGrace (so work that nobody waits on
// still completes). On the latency path a message thus costs no thread hand-off. A blocking
// send or receive on a connected channel with nothing else to move skips even the Work: it
// drives its one transfer directly (transferNow, Note [Direct path]).

// Completion: a send's Work completes when all its bytes were handed to the transport (written
// into the shared-memory ring or the socket), not when the peer received them; from then on the
// caller may reuse the buffer. A receive's Work completes when the whole message is in its
// buffer. Until completion the buffer belongs to the channel.
//
// Deadlines: each operation must complete within its timeout from the moment it was posted
// (the first operation also waits for the peer to make the connection). A failure (timeout,
// peer death, mismatch) fails every operation of the channel, now and later, with an error
// whose message names ranks of the parent group; the parent group itself is not aborted.
//
// Threading: post() is thread-safe. close() (and the destructor) fails what is still pending
// (PeerError), waits for a thread that is driving and joins the worker; it can wait for the
// connection phase (bounded by the group timeout). The parent group closes its channels before
// it goes: a Work that outlives them only reports their failure.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/work.h"
#include "common/deadline.h"
#include "common/types.h"
#include "transport/endpoint.h"

namespace shoal::comm {

class Group;
class NativeEngine;

class P2pChannel : public std::enable_shared_from_this<P2pChannel> {
 public:
  P2pChannel(NativeEngine& parent, int peer, int tag);
  ~P2pChannel();
  P2pChannel(const P2pChannel&) = delete;
  P2pChannel& operator=(const P2pChannel&) = delete;

  // Made by std::make_shared only (Works refer back to their channel).
  std::shared_ptr<Work> post(bool isSend, void* data, size_t count, DataType type,
                             Duration timeout);

  // The direct path (Note [Direct path] in the .cpp): a blocking send or receive, moved on the
  // calling thread without a Work or an operation of the pair group when the channel is
  // connected and idle. Returns false, having done nothing, when it is not (the caller posts
  // and waits instead). Otherwise returns true once the transfer completed (as a Work of post()
  // would), or throws the channel's failure. Work posted meanwhile by other threads is taken
  // into the general path, so it never waits behind this call.
  bool transferNow(bool isSend, void* data, size_t count, DataType type, Duration timeout);

  // Stops the channel: see the threading note above. Idempotent.
  void close();

 private:
  struct Op {
    bool send = false;
    void* data = nullptr;
    size_t count = 0;
    DataType type = DataType::kFloat32;
    Deadline deadline{Duration(0)};
    std::shared_ptr<Work> work;
  };
  void loop();
  std::shared_ptr<Work> makeWork();
  // The transfer that moves a send or receive of `count` x `type` at `data`, numbered next in
  // its direction. The driver only.
  transport::Transfer transferOf(bool send, void* data, size_t count, DataType type, int pairRank,
                                 uint32_t pairId);
  // Whom this rank waits on, for a timeout elsewhere (Note [Waiting chains]). The driver only.
  void postWaiting(Clock::time_point quietSince, Duration slowAfter, Clock::time_point now);
  void clearWaiting();
  Duration waitingAfter() const;
  // Waiting on `work` (Work::setProgress): drives until it completes, unless another thread
  // drives or the channel is not connected yet (then the caller sleeps on the work).
  void progressFor(const Work& work, const Deadline& deadline);
  // The driver's loop; the caller set driving_. Returns when no work is left, or `enough()`
  // (checked whenever a transfer completed or all wait), or at `limit` (never a timeout: only
  // an operation's own deadline fails the channel); with `once`, as soon as nothing moves. The
  // worker (`isWorker`) also lets go when a waiter asks. A failure fails the channel.
  void drive(const std::function<bool()>& enough, bool once, bool isWorker, const Deadline& limit);
  // Releases driving_, telling the worker if work is left.
  void release(std::unique_lock<std::mutex>& lock);
  // Under mutex_, and only when nobody drives (active_ belongs to the driver).
  bool hasWork() const { return !incoming_.empty() || !active_.empty(); }
  // Fails everything in flight and posted later with `error` (set once).
  void failAll(std::exception_ptr error);
  std::exception_ptr translate(std::exception_ptr error) const;
  int endOfWaitingChain() const;

  NativeEngine& parent_;  // used only while not closed
  const int rank_;
  const int peer_;
  const int tag_;
  std::mutex mutex_;
  std::condition_variable workerWake_;  // the worker: work to drive, or stop
  std::condition_variable released_;    // threads waiting for the driver to let go
  std::deque<Op> incoming_;
  bool stop_ = false;
  bool driving_ = false;        // a thread drives the connection
  bool workerDriving_ = false;  // ... and it is the worker
  bool directDriving_ = false;  // ... and it is a transferNow() (Note [Direct path])
  // Set by post() while a transferNow() drives: it hands its transfer over to the general path.
  std::atomic<bool> postedWhileDirect_{false};
  bool workerIdle_ = true;       // the worker sleeps until told (not on watch or its grace timer)
  int waiters_ = 0;              // threads waiting to take over driving
  uint64_t drives_ = 0;          // how many times a thread started driving
  std::exception_ptr failed_;    // set once; every later post fails with it
  std::shared_ptr<Group> pair_;  // set by the worker once connected
  NativeEngine* pairEngine_ = nullptr;  // pair_'s, set with it
  // The driver's (whoever set driving_): posted work being moved, in post order.
  std::vector<Op> active_;
  std::vector<transport::Transfer> transfers_;
  uint64_t sendSeq_ = 0, recvSeq_ = 0;
  bool waitPosted_ = false;
  std::thread worker_;  // last: started when everything above exists
};

}  // namespace shoal::comm
