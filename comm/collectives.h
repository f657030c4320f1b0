// Collective operations over a Group, on raw buffers.
//
// Every call:
// - is collective: all ranks of the group call it, in the same order, with matching count,
//   dtype, op and root (a disagreement is a MismatchError on every rank);
// - blocks until done (the *Async forms return a Work instead; the buffers belong to the
//   operation until the Work completes);
// - is bounded by CallOptions::timeout, else the group's timeout: TimeoutError or PeerError on
//   every surviving rank, naming the peer, the operation and its sequence number;
// - accepts count 0 (nothing moves, but ranks still agree on the operation).
// Buffers hold `count` elements of `type` unless said otherwise; "per rank" buffers hold
// size() blocks of `count` elements, block i belonging to rank i.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::comm {

// In place: data = op over all ranks' data. kAvg divides the sum by size().
void allreduce(Group& g, void* data, size_t count, DataType type, ReduceOp op,
               const CallOptions& call = {});
std::shared_ptr<Work> allreduceAsync(Group& g, void* data, size_t count, DataType type, ReduceOp op,
                                     const CallOptions& call = {});

// root's data is copied into every rank's data.
void broadcast(Group& g, void* data, size_t count, DataType type, int root,
               const CallOptions& call = {});
std::shared_ptr<Work> broadcastAsync(Group& g, void* data, size_t count, DataType type, int root,
                                     const CallOptions& call = {});

// root's `bytes` on every rank, whatever their length (the length is broadcast first; other
// ranks' `bytes` are ignored). A length above maxBytes is an InvalidArgument on the ranks that
// receive it (checked before anything is allocated for it).
std::string broadcastBytes(Group& g, std::string bytes, int root = 0,
                           size_t maxBytes = size_t{1} << 30, const CallOptions& call = {});

// root's data = op over all ranks' data; other ranks' data is left unchanged.
void reduce(Group& g, void* data, size_t count, DataType type, ReduceOp op, int root,
            const CallOptions& call = {});
std::shared_ptr<Work> reduceAsync(Group& g, void* data, size_t count, DataType type, ReduceOp op,
                                  int root, const CallOptions& call = {});

// recv (per rank) block i = rank i's send (count elements).
void allgather(Group& g, const void* send, void* recv, size_t count, DataType type,
               const CallOptions& call = {});
std::shared_ptr<Work> allgatherAsync(Group& g, const void* send, void* recv, size_t count,
                                     DataType type, const CallOptions& call = {});

// send is per rank; recv (count elements) = op over all ranks of their send block `rank`.
void reduceScatter(Group& g, const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                   const CallOptions& call = {});
std::shared_ptr<Work> reduceScatterAsync(Group& g, const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, const CallOptions& call = {});

// send and recv per rank: recv block j = rank j's send block `rank`.
void alltoall(Group& g, const void* send, void* recv, size_t count, DataType type,
              const CallOptions& call = {});
std::shared_ptr<Work> alltoallAsync(Group& g, const void* send, void* recv, size_t count,
                                    DataType type, const CallOptions& call = {});

// root's recv (per rank; ignored elsewhere, may be null) block i = rank i's send.
void gather(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
            const CallOptions& call = {});
std::shared_ptr<Work> gatherAsync(Group& g, const void* send, void* recv, size_t count,
                                  DataType type, int root, const CallOptions& call = {});

// every rank's recv = root's send (per rank; ignored elsewhere, may be null) block `rank`.
void scatter(Group& g, const void* send, void* recv, size_t count, DataType type, int root,
             const CallOptions& call = {});
std::shared_ptr<Work> scatterAsync(Group& g, const void* send, void* recv, size_t count,
                                   DataType type, int root, const CallOptions& call = {});

// Returns once every rank has entered the barrier.
void barrier(Group& g, const CallOptions& call = {});
std::shared_ptr<Work> barrierAsync(Group& g, const CallOptions& call = {});

// Point to point. Not collective: only the two ranks take part.
// - Matching: messages from a to b with the same tag are matched in order: the k-th send from a
//   to b with tag t is the k-th receive on b from a with tag t, and count and type must agree
//   (MismatchError on both sides). Different tags, and the two directions, are independent.
//   Tags are >= 0 (the blocking and *Async forms use tag 0).
// - Progress: each (peer, tag) has a channel of its own (comm/native/p2p_channel.h), connected on
// first
//   use, so point-to-point never waits behind the group's collectives, and sends and receives in
//   flight move together: two ranks may send each other large messages at the same time, or a
//   ring of ranks each send to the next before receiving, without deadlock.
// - Completion: an isend's Work completes once all its bytes were handed to the transport (the
//   buffer may then be reused; the peer may not have received them yet); an irecv's once the
//   whole message is in its buffer. Until then the buffer belongs to the operation.
// - Deadline: the call's timeout (else the group's), counted from posting; the first operation
//   with a peer also waits within it for the peer's first operation with that tag. A failure
//   fails every pending and later operation of that (peer, tag) channel; the group's collectives
//   are not affected.
// - Thread-safe: any thread may post.
// A group on a backend (SHOAL_BACKEND=mpi) runs point-to-point in issue order with its
// collectives, and supports tag 0 only.
std::shared_ptr<Work> isend(Group& g, const void* data, size_t count, DataType type, int peer,
                            int tag = 0, const CallOptions& call = {});
std::shared_ptr<Work> irecv(Group& g, void* data, size_t count, DataType type, int peer,
                            int tag = 0, const CallOptions& call = {});

// One send or receive of a batch.
struct P2pOp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* data = nullptr;  // a send only reads it
  size_t count = 0;
  DataType type = DataType::kFloat32;
  int peer = 0;
  int tag = 0;
};

// Posts every operation (in order, to several peers if need be) and returns one Work that
// completes when all of them did, with the first error if any failed. What a pipeline schedule
// posts at each step. Every operation is checked before any is posted (InvalidArgument).
std::shared_ptr<Work> batchIsendIrecv(Group& g, const std::vector<P2pOp>& ops,
                                      const CallOptions& call = {});

// Blocking forms (tag 0): return when isend / irecv completed; throw its error.
void send(Group& g, const void* data, size_t count, DataType type, int peer,
          const CallOptions& call = {});
void recv(Group& g, void* data, size_t count, DataType type, int peer,
          const CallOptions& call = {});
// Same as isend / irecv with tag 0.
std::shared_ptr<Work> sendAsync(Group& g, const void* data, size_t count, DataType type, int peer,
                                const CallOptions& call = {});
std::shared_ptr<Work> recvAsync(Group& g, void* data, size_t count, DataType type, int peer,
                                const CallOptions& call = {});

}  // namespace shoal::comm
