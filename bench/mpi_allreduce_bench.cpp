// OpenMPI's MPI_Allreduce (float32, sum, in place), timed and verified by the shared loop
// (bench/bench_common.h). Run under mpirun; the settings under test (MCA parameters, malloc
// tunables) come from mpirun's command line and environment, and --variant names them in the
// output. Exits non-zero if any rank's result was wrong.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "bench/bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CLI::App app{"OpenMPI all-reduce benchmark"};
  shoal::bench::MeasureOptions m;
  size_t maxBytes = 256u << 20;
  std::string variant = "default";
  app.add_option("--reps", m.reps)->check(CLI::Range(1, 1000));
  app.add_option("--min-seconds", m.minSeconds)->check(CLI::Range(0.0, 60.0));
  app.add_option("--max-bytes", maxBytes)->check(CLI::Range(size_t{4096}, size_t{1} << 32));
  app.add_option("--variant", variant, "label for the settings under test");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  shoal::bench::Collective c;
  c.allreduce = [](float* d, size_t count) {
    MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  c.timing.maxOverRanks = [](double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  };
  c.timing.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  const bool ok = shoal::bench::runAllreduceSizes("openmpi", variant, rank, n, c,
                                                  shoal::bench::defaultSizes(maxBytes), m);
  MPI_Finalize();
  return ok ? 0 : 1;
}
