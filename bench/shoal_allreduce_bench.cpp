// Shoal's all-reduce, each algorithm, over one transport (--encrypt on: TCP links in TLS, checked,
// labelled "tcp+tls"; --transport auto: the links Shoal picks, shared memory within a host and
// TCP or TLS across hosts as under `shoal run --hosts`, unchecked). Started plainly it launches
// itself as --ranks local processes (like the demo); each rank runs the shared measurement loop
// (bench/bench_common.h: calibrated repetitions, every result verified). Exits non-zero if any
// rank's result was wrong.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <sstream>

#include "bench/bench_common.h"
#include "bench/shoal_links.h"
#include "comm/collectives.h"
#include "run/init.h"
#include "run/local_job.h"

using namespace shoal;

int main(int argc, char** argv) {
  CLI::App app{"Shoal all-reduce benchmark"};
  int ranks = 2;
  bench::MeasureOptions m;
  std::string transport = "shm", algorithms = "auto,ring,recursive_doubling,rabenseifner,driver";
  std::string op = "sum";
  std::string encrypt = "off";
  size_t maxBytes = 256u << 20;
  app.add_option("-n,--ranks", ranks)->check(CLI::Range(1, 64));
  app.add_option("--transport", transport)->check(CLI::IsMember({"shm", "tcp", "auto"}));
  app.add_option("--encrypt", encrypt, "TLS on the TCP links (SHOAL_ENCRYPT; needs tcp)")
      ->check(CLI::IsMember({"off", "on"}));
  app.add_option("--algorithms", algorithms, "comma-separated");
  app.add_option("--op", op, "sum, or avg (ReduceOp::kAvg: the sum divided by the world size)")
      ->check(CLI::IsMember({"sum", "avg"}));
  app.add_option("--reps", m.reps, "measurements per size")->check(CLI::Range(1, 1000));
  app.add_option("--corrupt-rank", m.corruptRank, "test hook: damage this rank's results")
      ->check(CLI::Range(-1, 63));
  app.add_option("--min-seconds", m.minSeconds, "lower bound on one measurement")
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--max-bytes", maxBytes)->check(CLI::Range(size_t{4096}, size_t{1} << 32));
  CLI11_PARSE(app, argc, argv);
  if (encrypt == "on" && transport != "tcp") {
    std::fprintf(stderr,
                 "--encrypt on: needs --transport tcp (shared memory is never encrypted)\n");
    return 2;
  }

  if (!std::getenv("SHOAL_RANK")) {
    return run::runSelfLocally(
        ranks,
        {"--transport", transport, "--encrypt", encrypt, "--algorithms", algorithms, "--op", op,
         "--reps", std::to_string(m.reps), "--min-seconds", std::to_string(m.minSeconds),
         "--corrupt-rank", std::to_string(m.corruptRank), "--max-bytes", std::to_string(maxBytes)},
        {{"SHOAL_TRANSPORT", transport}, {"SHOAL_ENCRYPT", encrypt}}, std::chrono::minutes(30));
  }

  World session = init();  // kept: with SHOAL_TRACE it writes the rank's trace when it goes
  auto world = session.group;
  const std::string label = transport + (encrypt == "on" ? "+tls" : "");
  if (transport != "auto" &&
      !bench::linksAre(*world, encrypt == "on"      ? transport::LinkKind::kTls
                               : transport == "tcp" ? transport::LinkKind::kTcp
                                                    : transport::LinkKind::kShm)) {
    return 1;
  }
  bench::Collective c;
  c.average = op == "avg";
  const ReduceOp redop = c.average ? ReduceOp::kAvg : ReduceOp::kSum;
  c.timing.maxOverRanks = [&](double v) {
    comm::allreduce(*world, &v, 1, DataType::kFloat64, ReduceOp::kMax);
    return v;
  };
  c.timing.barrier = [&] { comm::barrier(*world); };
  std::stringstream list(algorithms);
  std::string name;
  while (std::getline(list, name, ',')) {
    auto algo = comm::parseAllreduceAlgorithm(name);
    c.allreduce = [&, algo](float* d, size_t count) {
      comm::allreduce(*world, d, count, DataType::kFloat32, redop, {.algorithm = algo});
    };
    if (!bench::runAllreduceSizes("shoal", label + "/" + name, world->rank(), world->size(), c,
                                  bench::defaultSizes(maxBytes), m)) {
      return 1;
    }
  }
  return 0;
}
