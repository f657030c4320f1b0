// OpenMPI behind the Group interface (comm/engine.h), for clusters that already run MPI.
//
// MPI is initialized on first use with MPI_THREAD_SERIALIZED (a group's operations run on one
// thread at a time, see comm/engine.h) and finalized when the process exits, unless the
// program initialized MPI itself, in which case it keeps ownership of both.
//
// Every operation is started non-blocking and completed by testing it until the deadline:
// MPI's own blocking calls cannot time out, and Shoal's contract is never to hang. An operation
// that times out cannot be cancelled; its group refuses later calls.
//
// Traces: an operation's span has no wait_us / transfer_us (Note [Operation spans] in
// comm/group.cpp). When a peer's message arrives is known only inside the library's progress
// engine; MPI_Test says when the whole operation is done, nothing earlier, so this engine keeps
// Engine::watchFirstArrival's default and the span covers waiting and moving together.
//
// float16 and bfloat16 have no MPI type: they travel as 2-byte types with Shoal's reduction
// kernels as user-defined MPI operations, so their rounding matches the native engine's.
#pragma once

#include <memory>
#include <string>

#include "comm/engine.h"

namespace shoal::comm::mpi {

// MPI_COMM_WORLD as an engine (initializes MPI if needed).
std::shared_ptr<Engine> worldEngine();

// Rank 0's `value`, on every rank of MPI_COMM_WORLD (initializes MPI if needed). Used for
// rendezvous: the store's address and the job secret travel this way under mpirun.
std::string broadcastFromRankZero(const std::string& value, Duration timeout);

}  // namespace shoal::comm::mpi
