// OpenMPI's point-to-point between two ranks: MPI_Send / MPI_Recv for ping-pong latency and
// one-way bandwidth, MPI_Sendrecv for both ways at once; timed and checked by the shared loop
// (bench/bench_common.h). Run under `mpirun -n 2`; the settings under test (BTL, malloc
// tunables) come from mpirun's command line and environment, and --variant names them in the
// output. Exits non-zero if any message arrived wrong.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "bench/bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CLI::App app{"OpenMPI point-to-point benchmark"};
  shoal::bench::MeasureOptions m;
  std::string modes = "pingpong,oneway,bothways", variant = "vader";
  size_t latencyMax = 4096, bandwidthMin = 64u << 10, bandwidthMax = 64u << 20;
  app.add_option("--modes", modes, "comma-separated: pingpong, oneway, bothways");
  app.add_option("--reps", m.reps)->check(CLI::Range(1, 1000));
  app.add_option("--min-seconds", m.minSeconds)->check(CLI::Range(0.0, 60.0));
  app.add_option("--latency-max-bytes", latencyMax)->check(CLI::Range(size_t{8}, size_t{1} << 20));
  app.add_option("--bandwidth-min-bytes", bandwidthMin)
      ->check(CLI::Range(size_t{8}, size_t{1} << 30));
  app.add_option("--bandwidth-max-bytes", bandwidthMax)
      ->check(CLI::Range(size_t{8}, size_t{1} << 30));  // MPI counts are int
  app.add_option("--variant", variant, "label for the settings under test");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  if (n != 2) {
    if (rank == 0) std::fprintf(stderr, "p2p_mpi_bench needs exactly 2 ranks, got %d\n", n);
    MPI_Finalize();
    return 2;
  }
  const int peer = 1 - rank;
  shoal::bench::PointToPoint p;
  p.send = [&](const void* d, size_t bytes) {
    MPI_Send(d, static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD);
  };
  p.recv = [&](void* d, size_t bytes) {
    MPI_Recv(d, static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  p.exchange = [&](const void* out, void* in, size_t bytes) {
    MPI_Sendrecv(out, static_cast<int>(bytes), MPI_BYTE, peer, 1, in, static_cast<int>(bytes),
                 MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  p.timing.maxOverRanks = [](double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  };
  p.timing.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };

  bool ok = true;
  int rc = 0;
  std::stringstream list(modes);
  std::string name;
  while (ok && std::getline(list, name, ',')) {
    shoal::bench::P2pMode mode;
    std::vector<size_t> sizes;
    if (name == "pingpong") {
      mode = shoal::bench::P2pMode::kPingPong;
      for (size_t b = 8; b <= latencyMax; b *= 8) sizes.push_back(b);
    } else if (name == "oneway" || name == "bothways") {
      mode = name == "oneway" ? shoal::bench::P2pMode::kOneWay : shoal::bench::P2pMode::kBothWays;
      sizes = shoal::bench::powersOf4(bandwidthMin, bandwidthMax);
    } else {
      if (rank == 0) std::fprintf(stderr, "--modes: unknown mode '%s'\n", name.c_str());
      rc = 2;
      break;
    }
    const char* api = mode == shoal::bench::P2pMode::kBothWays ? "/MPI_Sendrecv" : "/MPI_Send";
    ok = shoal::bench::runP2p("openmpi", variant + api, rank, n, p, mode, sizes, m);
  }
  MPI_Finalize();
  return rc ? rc : (ok ? 0 : 1);
}
