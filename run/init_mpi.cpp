#include "run/init_mpi.h"

#include "comm/mpi/mpi_engine.h"
#include "run/init_backend.h"

namespace shoal {

World initWithMpi() {
  const run::MpiBridge bridge{comm::mpi::worldEngine, comm::mpi::broadcastFromRankZero};
  return run::initWith(&bridge);
}

}  // namespace shoal
