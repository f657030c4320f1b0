// Private to run/: how init() reaches OpenMPI without linking it. shoal_run never links MPI
// (a program that only needs the native engine must not need OpenMPI installed); the library
// Shoal::mpi (run/init_mpi.cpp) hands init() these two calls through initWithMpi().
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/engine.h"
#include "run/init.h"

namespace shoal::run {

struct MpiBridge {
  // MPI_COMM_WORLD as an engine (SHOAL_BACKEND=mpi).
  std::function<std::shared_ptr<comm::Engine>()> worldEngine;
  // Rank 0's value on every rank (the store's address under mpirun without SHOAL_STORE_ADDR).
  std::function<std::string(const std::string&, Duration)> broadcastFromRankZero;
};

// init() with MPI available (mpi non-null) or not (null: SHOAL_BACKEND=mpi and the mpirun
// rendezvous over MPI are refused with an error saying how to link it).
World initWith(const MpiBridge* mpi);

}  // namespace shoal::run
