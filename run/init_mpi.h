// shoal::init() with OpenMPI behind it, from the library Shoal::mpi (CMake target shoal_run_mpi;
// it defines SHOAL_HAVE_MPI for the code that links it).
//
// The same as init() (run/init.h: blocking, bounded by the group timeout, the same errors), and
// besides: SHOAL_BACKEND=mpi runs the collectives on OpenMPI, and a job started by mpirun without
// SHOAL_STORE_ADDR finds its store over MPI (rank 0 hosts it and broadcasts where). Plain init()
// refuses both with an InvalidArgument that names this call, so a program never links OpenMPI
// unless it asks to.
#pragma once

#include "run/init.h"

namespace shoal {

World initWithMpi();

}  // namespace shoal
