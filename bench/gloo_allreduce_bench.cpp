// Gloo's all-reduce through libtorch's c10d ProcessGroupGloo (the CPU backend PyTorch's DDP
// uses), float32 sum, timed and verified by the shared loop (bench/bench_common.h). Launches
// itself as --ranks local processes; exits non-zero if any rank's result was wrong.
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "bench/bench_common.h"
#include "run/local_job.h"
#include "run/rendezvous.h"

int main(int argc, char** argv) {
  CLI::App app{"Gloo (c10d ProcessGroupGloo) all-reduce benchmark"};
  int ranks = 2;
  shoal::bench::MeasureOptions m;
  size_t maxBytes = 256u << 20;
  std::string storePath;
  app.add_option("-n,--ranks", ranks)->check(CLI::Range(1, 64));
  app.add_option("--reps", m.reps)->check(CLI::Range(1, 1000));
  app.add_option("--min-seconds", m.minSeconds)->check(CLI::Range(0.0, 60.0));
  app.add_option("--max-bytes", maxBytes)->check(CLI::Range(size_t{4096}, size_t{1} << 32));
  app.add_option("--store", storePath);
  CLI11_PARSE(app, argc, argv);

  const auto where = shoal::run::detectRendezvous(shoal::run::processEnv());
  if (where.launcher == shoal::run::Launcher::kNone) {
    std::string path = "/tmp/shoal-gloo-store-" + std::to_string(::getpid());
    ::unlink(path.c_str());
    int rc = shoal::run::runSelfLocally(
        ranks,
        {"--reps", std::to_string(m.reps), "--min-seconds", std::to_string(m.minSeconds),
         "--max-bytes", std::to_string(maxBytes), "--store", path},
        {{"OMP_NUM_THREADS", "1"}, {"OPENBLAS_NUM_THREADS", "1"}}, std::chrono::minutes(30));
    ::unlink(path.c_str());
    return rc;
  }

  torch::set_num_threads(1);
  const int rank = where.rank, n = where.size;
  auto store = c10::make_intrusive<c10d::FileStore>(storePath, n);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->timeout = std::chrono::minutes(5);
  c10d::ProcessGroupGloo pg(store, rank, n, options);

  shoal::bench::Collective c;
  c.allreduce = [&](float* d, size_t count) {
    std::vector<at::Tensor> t{torch::from_blob(d, {static_cast<int64_t>(count)}, torch::kFloat32)};
    pg.allreduce(t)->wait();
  };
  c.timing.maxOverRanks = [&](double v) {
    std::vector<at::Tensor> t{torch::tensor({v}, torch::kFloat64)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    pg.allreduce(t, o)->wait();
    return t[0].item<double>();
  };
  c.timing.barrier = [&] { pg.barrier()->wait(); };
  return shoal::bench::runAllreduceSizes("gloo", "ProcessGroupGloo", rank, n, c,
                                         shoal::bench::defaultSizes(maxBytes), m)
             ? 0
             : 1;
}
