// OpenMPI's MPI_Allreduce (float32, sum), timed by the shared loop. Run under mpirun.
#include <mpi.h>

#include <cstdlib>

#include "bench/bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  size_t maxBytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (256u << 20);
  shoal::bench::Collective c;
  c.allreduce = [](float* d, size_t count) {
    MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  c.maxOverRanks = [](double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  };
  c.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  shoal::bench::runSizes("openmpi", "MPI_Allreduce", rank, n, c,
                         shoal::bench::defaultSizes(maxBytes), reps);
  MPI_Finalize();
  return 0;
}
