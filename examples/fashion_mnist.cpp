// Data-parallel training of a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist), on
// train::Trainer (train/trainer.h): this file is the model, the data, the flags and what rank 0
// prints; the loop, the strategy, checkpoints, straggler detection and the autotuner are the
// Trainer's.
//
//   shoal run -n 2 -- build/fashion_mnist            # the README's main command
//
// Every rank trains on its shard of each epoch, gradients are averaged by DistributedDataParallel
// while backward runs, rank 0 shows a progress bar and the test accuracy after each epoch, and
// writes one JSON line per epoch to --metrics. Checkpoints (--checkpoint-dir, sharded: each rank
// writes 1/N) every --checkpoint-every steps and at the end of each epoch; --resume continues
// exactly. Under `shoal run --run-dir DIR`, every rank reports its metrics into DIR/metrics.db
// (README "Run directories and experiment tracking").
//
// ZeRO instead of DDP, or parameter servers instead of all-reduce, is one flag:
//
//   shoal run -n 2 -- build/fashion_mnist --mode zero2
//   shoal run -n 2 --servers 1 -- build/fashion_mnist --mode ps-sync   # or ps-async,
//                                                                     # ps-ssp --staleness 2
//
// the server ranks hold the model and the optimizer (and write the checkpoints: their shards);
// the workers compute gradients.
//
// Elastic (ddp, zero1, zero2): the survivors of a dead or stalled worker go on, and workers
// started later join (train/trainer.h, "Elastic jobs"); whichever worker is rank 0 of the
// current view prints and writes the metrics:
//
//   shoal run --elastic 2:4 -n 4 --max-restarts 2 -- build/fashion_mnist --checkpoint-dir ck
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/collectives.h"
#include "common/error.h"
#include "examples/numeric_flags.h"
#include "ps/server.h"
#include "run/init.h"
#ifdef SHOAL_HAVE_MPI  // built with Shoal::mpi: SHOAL_BACKEND=mpi, and mpirun without a store
#include "run/init_mpi.h"
#endif
#include "run/run_directory.h"
#include "track/system_sampler.h"
#include "track/tracker.h"
#include "train/allocator.h"
#include "train/fashion_cnn.h"
#include "train/idx_dataset.h"
#include "train/trainer.h"
#include "train/trainer/progress_bar.h"
#include "train/trainer/tracking_callback.h"

using namespace shoal;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string optimizer = "adam";
  double lr = 1e-3;
  int64_t batch = 64;  // per rank
  int64_t epochs = 8;
  bool lrScaling = false;
  int64_t referenceBatch = 0;  // with lrScaling: scale by global batch / this, not by world size
  std::string lrDecay = "cosine";
  int64_t warmupSteps = 0;
  uint64_t seed = 1;
  int threads = 1;
  std::string dataDir = train::kFashionMnistDir;
  int64_t trainSubset = 0;  // 0: all 60000
  std::string metrics;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keep = 3;
  std::string resume;  // "latest"
  bool noOverlap = false;
  size_t bucketMb = 25;
  std::string saveParams;           // tests: rank 0 writes the final parameters here
  int64_t crashAtStep = -1;         // tests: --crash-rank kills itself after this step
  int64_t crashRank = -1;           // -1: the last rank
  int64_t stragglerWindow = 20;     // steps between straggler checks
  double stragglerThreshold = 1.3;  // slow: above this x the median rank's compute
  int64_t slowRank = -1;            // tests and demos: this rank computes about 3x as long
  bool autotune = false;            // ddp: pick bucket, overlap, algorithm over the first steps
  bool quiet = false;
  std::string mode = "ddp";          // ddp | zero1 | zero2 | ps-sync | ps-async | ps-ssp
  std::string compression = "none";  // comm/compress/spec.h
  bool pullHalf = false;             // ps modes: parameters pulled as fp16
  int staleness = 2;
};

bool isPs(const Flags& f) {
  return f.mode.starts_with("ps-");
}

// A server rank of a parameter-server job: serve until every worker is done.
int serveMain(const Flags& f, World& w) {
  ps::ServerOptions o;
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = f.checkpointEvery;
  o.keep = f.keep;
  o.replicas = w.psReplicas;            // shoal run --ps-replicas
  o.replacement = w.psReplacement > 0;  // shoal run --ps-replacements
  o.resume = !f.resume.empty();
  auto r = ps::serve(*w.group, w.roleRank, w.numServers, w.size - w.numServers, o);
  if (!f.quiet) {
    fmt::print("parameter server {}: {} pushes, {} pulls, {} refused, largest lead {} steps{}\n",
               w.roleRank, r.pushes, r.pulls, r.refused, r.maxLead,
               r.lastCheckpoint.empty() ? "" : ", last checkpoint " + r.lastCheckpoint);
  }
  return 0;
}

train::TrainerOptions trainerOptions(const Flags& f) {
  train::TrainerOptions o;
  o.strategy = isPs(f) ? train::Strategy::kParameterServer : train::parseStrategy(f.mode);
  o.optimizer.kind = train::parseOptimizer(f.optimizer);
  o.optimizer.lr = f.lr;
  o.epochs = f.epochs;
  o.batch = f.batch;
  o.seed = f.seed;
  o.warmupSteps = f.warmupSteps;
  o.cosineDecay = f.lrDecay == "cosine";
  o.linearScaling = f.lrScaling;
  o.referenceBatch = f.referenceBatch;
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = f.checkpointEvery;
  o.keep = f.keep;
  o.resume = !f.resume.empty();
  o.bucketBytes = f.bucketMb << 20;
  o.overlap = !f.noOverlap;
  o.autotune = f.autotune;
  o.stragglerWindow = static_cast<int>(f.stragglerWindow);
  o.stragglerThreshold = f.stragglerThreshold;
  const auto compression = compress::CompressionSpec::parse(f.compression);
  if (isPs(f)) {
    o.psMode = ps::parseMode(f.mode);
    o.staleness = f.staleness;
    o.psClient.compression = compression;
    o.psClient.pullHalf = f.pullHalf;
  } else {
    o.compression = compression;
  }
  return o;
}

// What the lead (rank 0 of the workers; in an elastic job, of the current view) prints and
// writes: the resume point, view changes, each epoch's line and its JSON line. Given to every
// worker: an elastic job's lead may change.
class Report final : public train::Callback {
 public:
  Report(const Flags& f, train::Trainer& trainer, std::ofstream metrics)
      : f_(f), trainer_(trainer), metrics_(std::move(metrics)) {}

  void onFitStart(const train::Progress& at) override {
    if (at.step == 0 || !lead()) return;
    fmt::print("resumed from {}: epoch {}, batch {}, step {}\n",
               isPs(f_) ? std::string("the parameter servers") : f_.checkpointDir, at.epoch + 1,
               at.batchInEpoch, at.step);
    std::fflush(stdout);
  }
  void onViewChange(const train::ViewChange& v) override {
    if (!lead() || f_.quiet) return;
    fmt::print("view {}: {} workers (was {}), from step {}, recovered in {:.2f} s\n", v.generation,
               v.newSize, v.oldSize, v.resumedStep, v.recoverySeconds);
    std::fflush(stdout);
  }
  void onStep(const train::StepInfo& s) override { lr_ = s.lr; }
  void onEpoch(const train::EpochMetrics& m) override {
    if (!lead()) return;
    // Training time and throughput: the epoch's steps, without its validation.
    const double rate = m.trainSeconds > 0 ? static_cast<double>(m.samples) / m.trainSeconds : 0;
    if (!f_.quiet) {
      fmt::print("epoch {}/{}: loss {:.4f}, test accuracy {:.2f}%, {:.1f} s, {:.0f} samples/s{}\n",
                 m.epoch + 1, f_.epochs, m.trainLoss, 100 * m.validationAccuracy, m.trainSeconds,
                 rate, sentPerStep());
      std::fflush(stdout);
    }
    if (f_.metrics.empty()) return;
    // A lead that took over in an elastic job opens the file now (appending).
    if (!metrics_.is_open()) metrics_.open(f_.metrics, std::ios::app);
    metrics_ << nlohmann::json{{"epoch", m.epoch + 1},
                               {"step", m.step},
                               {"ranks", trainer_.workers().size()},
                               {"loss", m.trainLoss},
                               {"test_accuracy", m.validationAccuracy},
                               {"epoch_seconds", m.trainSeconds},
                               {"samples_per_second", rate},
                               {"lr", lr_},
                               {"elapsed_seconds",
                                std::chrono::duration<double>(Clock::now() - start_).count()}}
                    .dump()
             << "\n";
    metrics_.flush();
    if (!metrics_) SHOAL_THROW(SystemError, "--metrics {}: writing failed", f_.metrics);
  }

 private:
  bool lead() const { return trainer_.workers().rank() == 0; }

  // What a synchronized step really sent, for the epoch lines.
  std::string sentPerStep() const {
    const auto c = trainer_.communication();
    if (c.steps == 0) return "";
    return fmt::format(", {} {:.2f} MiB/step", isPs(f_) ? "pushed" : "sent",
                       static_cast<double>(c.bytesSent) / static_cast<double>(c.steps) / (1 << 20));
  }

  const Flags& f_;
  train::Trainer& trainer_;
  std::ofstream metrics_;
  double lr_ = 0;
  Clock::time_point start_ = Clock::now();
};

// Forwards to `inner` on the lead only (see Report).
class OnLead final : public train::Callback {
 public:
  OnLead(train::Trainer& trainer, std::shared_ptr<train::Callback> inner)
      : trainer_(trainer), inner_(std::move(inner)) {}
  void onStep(const train::StepInfo& s) override {
    if (trainer_.workers().rank() == 0) inner_->onStep(s);
  }
  void onEpoch(const train::EpochMetrics& m) override {
    if (trainer_.workers().rank() == 0) inner_->onEpoch(m);
  }

 private:
  train::Trainer& trainer_;
  std::shared_ptr<train::Callback> inner_;
};

// A rank dies after a given step: a test's stand-in for a machine that fails.
struct CrashAt final : train::Callback {
  int64_t step;
  explicit CrashAt(int64_t s) : step(s) {}
  void onStep(const train::StepInfo& s) override {
    if (s.step != step) return;
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
};

// The metrics file is opened (by the lead, which writes it) before anything is trained, and every
// worker learns whether that worked: an unwritable path is a configuration error now, not a
// silent loss after the first epoch. Not by a worker that joins an elastic job (`joiner`): its
// group's first collectives are the running workers' view change.
std::ofstream openMetrics(const Flags& f, comm::Group& workers, bool joiner) {
  std::ofstream metrics;
  if (f.metrics.empty() || joiner) return metrics;
  const bool lead = workers.rank() == 0;
  int opened = 1;
  int err = 0;
  if (lead) {
    metrics.open(f.metrics, std::ios::app);
    err = errno;
    opened = metrics.is_open() ? 1 : 0;
  }
  comm::broadcast(workers, &opened, 1, DataType::kInt32, 0);
  if (!opened) {
    SHOAL_THROW(InvalidArgument, "--metrics {}: cannot be opened for writing{}", f.metrics,
                lead ? fmt::format(" ({})", std::strerror(err)) : std::string(" on rank 0"));
  }
  return metrics;
}

int trainMain(const Flags& f) {
  train::keepFreedMemoryForReuse();
#ifdef SHOAL_HAVE_MPI
  World w = initWithMpi();
#else
  World w = init();
#endif
  if (isPs(f) && w.numServers == 0) {
    SHOAL_THROW(InvalidArgument,
                "--mode {} needs parameter servers: start the job with shoal run -n N --servers K",
                f.mode);
  }
  if (!isPs(f) && w.numServers > 0) {
    SHOAL_THROW(InvalidArgument,
                "the job has {} parameter servers but --mode is {}: pass --mode ps-sync, "
                "ps-async or ps-ssp",
                w.numServers, f.mode);
  }
  if (w.role == run::Role::kServer) return serveMain(f, w);
  torch::set_num_threads(f.threads);
  torch::manual_seed(f.seed);  // the same initial model everywhere (rank 0's is broadcast anyway)

  train::FashionCnn model;
  // --slow-rank: that rank's forward runs the model about three more times (a demo and test of
  // straggler detection: the extra work lands in its compute phase).
  const int64_t workers = w.size - w.numServers;
  const bool slow = w.rank < workers && w.rank == f.slowRank;
  auto forward = [model, slow](const torch::Tensor& x) mutable {
    if (slow) {
      torch::NoGradGuard noGrad;
      for (int i = 0; i < 6; ++i) model->forward(x);
    }
    return model->forward(x);
  };
  train::Trainer trainer({w.group, w.numServers, w.psReplicas, w.elastic}, model.ptr(), forward,
                         train::crossEntropy, trainerOptions(f));
  comm::Group& g = trainer.workers();
  const bool lead = g.rank() == 0;
  const bool joiner = w.elastic && w.elastic->membership->current().generation > 0;
  std::ofstream metrics = openMetrics(f, g, joiner);

  auto read = [&](const char* split, int64_t subset) {
    const auto d = train::readIdxDataset(f.dataDir, split, subset);
    return train::TensorDataset{d.images, d.labels};
  };
  const auto trainSet = read("train", f.trainSubset);
  const auto testSet = read("t10k", 0);

  // Under `shoal run --run-dir`: every rank's metrics into the run's store (the dashboard's
  // curves), its CPU and memory every second.
  std::optional<track::Tracker> tracker;
  std::optional<track::SystemSampler> systemSampler;
  if (auto dir = run::runDirectoryFromEnv()) {
    tracker.emplace(track::TrackerOptions{.path = run::metricsPath(*dir), .rank = w.rank});
    systemSampler.emplace(*tracker,
                          track::SystemSamplerOptions{.interval = std::chrono::seconds(1)});
    trainer.addCallback(std::make_shared<train::TrackingCallback>(
        *tracker,
        train::TrackingOptions{.rank = g.rank(), .lead = lead, .commWait = f.mode == "ddp"}));
  }
  if (!f.quiet) {
    trainer.addCallback(
        std::make_shared<OnLead>(trainer, std::make_shared<train::ProgressBar>(f.epochs)));
  }
  trainer.addCallback(std::make_shared<Report>(f, trainer, std::move(metrics)));
  if (f.crashAtStep > 0 && g.rank() == (f.crashRank >= 0 ? f.crashRank : g.size() - 1)) {
    trainer.addCallback(std::make_shared<CrashAt>(f.crashAtStep));
  }
  // The autotuner's choice, when it makes it.
  struct AutotuneLine final : train::Callback {
    void onStep(const train::StepInfo& s) override {
      if (s.autotuned.empty()) return;
      fmt::print("autotune: {}\n", s.autotuned);
      std::fflush(stdout);
    }
  };
  if (lead && f.autotune) trainer.addCallback(std::make_shared<AutotuneLine>());

  if (lead && !f.quiet) {
    fmt::print(
        "fashion_mnist: {} {} ({}), batch {} per rank, {} lr {}{}{}, {} epochs, {} training "
        "samples\n",
        g.size(),
        isPs(f) ? fmt::format("workers and {} parameter servers ({}{})", w.numServers, f.mode,
                              f.mode == "ps-ssp" ? fmt::format(", staleness {}", f.staleness) : "")
                : fmt::format("ranks, {}", f.mode),
        toString(w.launcher), f.batch, f.optimizer, f.lr, f.lrScaling ? " (scaled)" : "",
        f.warmupSteps ? fmt::format(" (warm-up {} steps)", f.warmupSteps) : "", f.epochs,
        trainSet.size());
    std::fflush(stdout);
  }
  trainer.fit(trainSet, &testSet);
  if (trainer.workers().rank() == 0 && !f.saveParams.empty()) {  // an elastic job's last lead
    std::vector<torch::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p);
    for (auto& b : model->buffers()) params.push_back(b);
    torch::save(params, f.saveParams);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shoal data-parallel training on Fashion-MNIST"};
  Flags f;
  examples::NumericFlags numbers;
  constexpr int64_t kMaxSteps = int64_t{1} << 40;
  app.add_option("--optimizer", f.optimizer,
                 "sgd, adam, rmsprop, or the layer-wise lamb and lars (not the ps modes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "rmsprop", "lamb", "lars"}));
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3,
                 "learning rate (per rank's batch; see --lr-scaling)");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "samples per rank per step");
  numbers.integer(app, "--epochs", f.epochs, 1, 10000, "epochs");
  app.add_flag("--lr-scaling", f.lrScaling,
               "multiply the learning rate by the world size, reached over --warmup-steps");
  numbers.integer(app, "--reference-batch", f.referenceBatch, 0, 1 << 30,
                  "with --lr-scaling (not ps): multiply by global batch / this instead (0: off)");
  app.add_option("--lr-decay", f.lrDecay, "cosine (to zero at the last step) or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "none"}));
  numbers.integer(app, "--warmup-steps", f.warmupSteps, 0, kMaxSteps,
                  "reach the learning rate linearly over N steps");
  numbers.integer(app, "--seed", f.seed, 0, std::numeric_limits<int64_t>::max(), "random seed");
  numbers.integer(app, "--threads", f.threads, 1, 256, "intra-op threads per rank");
  app.add_option("--data-dir", f.dataDir)->capture_default_str();
  numbers.integer(app, "--train-subset", f.trainSubset, 0, int64_t{1} << 32,
                  "train on the first N samples only (0: all)");
  app.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  app.add_option("--checkpoint-dir", f.checkpointDir,
                 "sharded checkpoints (ps: the servers'; elastic: one file per step)");
  numbers.integer(app, "--checkpoint-every", f.checkpointEvery, 0, kMaxSteps,
                  "steps between checkpoints (0: epochs only)");
  numbers.integer(app, "--keep", f.keep, 1, 1000, "checkpoints kept");
  app.add_option("--resume", f.resume, "'latest': continue from the newest checkpoint")
      ->check(CLI::IsMember({"latest"}));
  app.add_flag("--no-overlap", f.noOverlap, "all-reduce after backward instead of during it");
  numbers.integer(app, "--bucket-mb", f.bucketMb, 1, 4096, "gradient bucket size in MiB");
  app.add_option("--save-params", f.saveParams, "write the final parameters (tests)");
  numbers.integer(app, "--straggler-window", f.stragglerWindow, 1, 1 << 20,
                  "steps between straggler checks (a slow rank is named after two slow windows)");
  numbers.numberAbove(app, "--straggler-threshold", f.stragglerThreshold, 1, 1e6,
                      "a rank is slow in a window when its compute is above this many times the "
                      "median rank's");
  app.add_flag("--autotune", f.autotune,
               "ddp: try bucket sizes 1, 4, 25 MiB (those giving distinct buckets) with and "
               "without overlap and, without --compression, the all-reduce algorithm auto, ring, "
               "rabenseifner over the first steps (successive halving) and keep the fastest; "
               "pin an algorithm instead with SHOAL_ALLREDUCE_ALGORITHM");
  numbers.integer(app, "--slow-rank", f.slowRank, 0, 1 << 20,
                  "make this rank compute about 3x as long (to see straggler detection)");
  numbers.integer(app, "--crash-at-step", f.crashAtStep, 1, kMaxSteps,
                  "--crash-rank kills itself after this step (tests)");
  numbers.integer(app, "--crash-rank", f.crashRank, 0, 1 << 20,
                  "the rank --crash-at-step kills (default: the last)");
  app.add_flag("-q,--quiet", f.quiet, "no progress output");
  app.add_option("--mode", f.mode,
                 "ddp (all-reduce), zero1 or zero2 (optimizer state and gradients sharded), or "
                 "through parameter servers (shoal run --servers K): ps-sync, ps-async, ps-ssp")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "ps-sync", "ps-async", "ps-ssp"}));
  app.add_option("--compression", f.compression,
                 "gradient compression (ddp, zero1, ps modes): none, fp16, bf16, topk:DENSITY, "
                 "powersgd:RANK (not ps), onebit; optionally ,warmup=STEPS (steps sent "
                 "uncompressed first)")
      ->capture_default_str()
      ->check([](const std::string& text) {
        try {
          compress::CompressionSpec::parse(text);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      });
  app.add_flag("--pull-half", f.pullHalf,
               "ps modes: pull the parameters as fp16 (the servers keep float32)");
  numbers.integer(app, "--staleness", f.staleness, 0, 1000000,
                  "ps-ssp: steps a worker may run ahead of the slowest");
  // Configuration errors, from CLI11, the numbers or the environment: one line, exit code 2.
  return examples::runExample("fashion_mnist", app, numbers, argc, argv,
                              [&] { return trainMain(f); });
}
