// A short all-reduce demo: each rank all-reduces a buffer with every algorithm, checks the
// result against the closed-form sum, and rank 0 reports what happened and how long it took.
// Runs under any launcher shoal::init() knows: shoal run -n 4 -- shoal_demo, mpirun, srun, a
// Kubernetes Indexed Job, or plainly as a world of one.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "run/init.h"
#ifdef SHOAL_HAVE_MPI  // built with Shoal::mpi: SHOAL_BACKEND=mpi, and mpirun without a store
#include "run/init_mpi.h"
#endif

using namespace shoal;

namespace {

std::string linksOf(comm::Group& g) {
  if (g.engineName() != "native") return std::string(g.engineName());
  std::string s;
  for (int p = 0; p < g.size(); ++p) {
    if (p == g.rank()) continue;
    s += fmt::format("{}{}:{}", s.empty() ? "" : " ", p,
                     toString(comm::nativeEngine(g).linkKind(p)));
  }
  return s.empty() ? "none" : s;
}

int runRank(size_t count, int iterations) {
#ifdef SHOAL_HAVE_MPI
  World w = initWithMpi();
#else
  World w = init();
#endif
  auto world = w.group;
  const int rank = world->rank(), n = world->size();
  // Every rank says where it runs and how it reaches each peer (the multi-host test reads it).
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  fmt::print("rank {} of {} on {} (local {} of {}), started by {}; links {}\n", rank, n, host,
             w.localRank, w.localSize, toString(w.launcher), linksOf(*world));
  std::fflush(stdout);
  if (rank == 0) {
    fmt::print("shoal demo: {} ranks, all-reduce of {} float32 ({:.1f} MiB)\n", n, count,
               count * 4.0 / (1 << 20));
  }
  std::vector<float> data(count);
  for (auto algo : {comm::AllreduceAlgorithm::kRing, comm::AllreduceAlgorithm::kRecursiveDoubling,
                    comm::AllreduceAlgorithm::kDriver}) {
    double best = 1e30;
    for (int it = 0; it < iterations; ++it) {
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1) * (i % 7);
      comm::barrier(*world);
      auto t0 = std::chrono::steady_clock::now();
      comm::allreduce(*world, data.data(), count, DataType::kFloat32, ReduceOp::kSum,
                      {.algorithm = algo});
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // sum over ranks of (r+1) * (i % 7) = n(n+1)/2 * (i % 7)
    const float factor = n * (n + 1) / 2.0f;
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += data[i] != factor * (i % 7);
    int bad = wrong > 0;
    comm::allreduce(*world, &bad, 1, DataType::kInt32, ReduceOp::kMax);
    if (rank == 0) {
      fmt::print("  {:<19} {:8.3f} ms  {:6.2f} GB/s algbw  result {}\n", toString(algo), best * 1e3,
                 count * 4.0 / best / 1e9, bad ? "WRONG" : "verified on every rank");
    }
    if (bad) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shoal all-reduce demo"};
  size_t count = 1 << 20;
  int iterations = 5;
  app.add_option("--count", count, "float32 elements per rank");
  app.add_option("--iterations", iterations, "timed repetitions per algorithm")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  try {
    return runRank(count, iterations);
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal demo: {}\n", e.what());
    return 1;
  }
}
