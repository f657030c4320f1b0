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

// Point to point. Not collective: only the two ranks take part. Messages between a pair are
// matched in order: the k-th send from a to b is the k-th recv on b from a, and its count and
// type must agree (MismatchError otherwise). Sends and receives are ordered with the group's
// collectives: receive what a peer sent before the next collective you both run.
void send(Group& g, const void* data, size_t count, DataType type, int peer,
          const CallOptions& call = {});
void recv(Group& g, void* data, size_t count, DataType type, int peer,
          const CallOptions& call = {});
std::shared_ptr<Work> sendAsync(Group& g, const void* data, size_t count, DataType type, int peer,
                                const CallOptions& call = {});
std::shared_ptr<Work> recvAsync(Group& g, void* data, size_t count, DataType type, int peer,
                                const CallOptions& call = {});

}  // namespace shoal::comm
