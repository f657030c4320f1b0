// Shoal's all-reduce, each algorithm, over one transport. Started plainly it launches itself
// as --ranks local processes (like the demo); each rank runs the shared measurement loop.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "bench/bench_common.h"
#include "comm/collectives.h"
#include "run/init.h"
#include "run/local_job.h"

using namespace shoal;

int main(int argc, char** argv) {
  CLI::App app{"Shoal all-reduce benchmark"};
  int ranks = 2, reps = 7;
  std::string transport = "shm", algorithms = "auto,ring,recursive_doubling,driver";
  size_t maxBytes = 256u << 20;
  app.add_option("-n,--ranks", ranks)->check(CLI::Range(1, 64));
  app.add_option("--transport", transport)->check(CLI::IsMember({"shm", "tcp"}));
  app.add_option("--algorithms", algorithms, "comma-separated");
  app.add_option("--reps", reps)->check(CLI::Range(1, 1000));
  app.add_option("--max-bytes", maxBytes);
  CLI11_PARSE(app, argc, argv);

  if (!std::getenv("SHOAL_RANK")) {
    return run::runSelfLocally(ranks,
                               {"--transport", transport, "--algorithms", algorithms, "--reps",
                                std::to_string(reps), "--max-bytes", std::to_string(maxBytes)},
                               {{"SHOAL_TRANSPORT", transport}}, std::chrono::minutes(30));
  }

  auto world = init().group;
  std::stringstream list(algorithms);
  std::string name;
  while (std::getline(list, name, ',')) {
    auto algo = comm::parseAllreduceAlgorithm(name);
    bench::Collective c;
    c.allreduce = [&](float* d, size_t count) {
      comm::allreduce(*world, d, count, DataType::kFloat32, ReduceOp::kSum, {.algorithm = algo});
    };
    c.maxOverRanks = [&](double v) {
      comm::allreduce(*world, &v, 1, DataType::kFloat64, ReduceOp::kMax);
      return v;
    };
    c.barrier = [&] { comm::barrier(*world); };
    bench::runSizes("shoal", transport + "/" + name, world->rank(), world->size(), c,
                    bench::defaultSizes(maxBytes), reps);
  }
  return 0;
}
