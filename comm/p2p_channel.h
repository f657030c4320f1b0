// One point-to-point channel: the messages between this rank and one peer with one tag, both
// directions, on a connection of their own.
//
// Why a connection of its own: point-to-point must not wait behind the group's collectives, and
// messages with different tags must not wait behind each other (a pipeline's activations and
// gradients). The channel's two-rank group is made lazily, on first use between the pair
// (Group::connect), so a grid of groups pays only for the pairs that talk.
//
// How: a worker thread owns the channel's connection. It takes posted sends and receives in post
// order, gives each direction consecutive sequence numbers (the k-th send is the k-th receive on
// the other side; count and type must agree, MismatchError otherwise) and moves all of them at
// once with transport::Endpoint::runUntil, taking newly posted work whenever the transfers in
// flight wait: two ranks sending large messages to each other both ways never deadlock, since
// each worker also takes its receive.
//
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
// Threading: post() is thread-safe. The destructor fails what is still pending (PeerError) and
// joins the worker; it can wait for the connection phase (bounded by the group timeout).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/work.h"
#include "common/deadline.h"
#include "common/types.h"

namespace shoal::comm {

class Group;

class P2pChannel {
 public:
  P2pChannel(Group& parent, int peer, int tag);
  ~P2pChannel();
  P2pChannel(const P2pChannel&) = delete;
  P2pChannel& operator=(const P2pChannel&) = delete;

  std::shared_ptr<Work> post(bool isSend, void* data, size_t count, DataType type,
                             Duration timeout);

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
  // Moves posted work until stopped (returns, leaving unfinished work in `active`) or failed
  // (throws the error, in the parent group's ranks, after failing `active`).
  void runConnected(Group& pair, std::vector<Op>& active);
  std::exception_ptr translate(std::exception_ptr error) const;
  int endOfWaitingChain() const;
  std::string what(const Op& op) const;

  Group& parent_;
  const int peer_;
  const int tag_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Op> incoming_;
  std::vector<Op> active_;  // worker only: posted work being moved
  bool stop_ = false;
  std::exception_ptr failed_;    // set once; every later post fails with it
  std::shared_ptr<Group> pair_;  // set by the worker once connected (for wake())
  std::thread worker_;           // last: started when everything above exists
};

}  // namespace shoal::comm
