// Data-parallel training of a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist):
//
//   shoal run -n 2 -- build/fashion_mnist            # the README's main command
//
// Every rank trains on its shard of each epoch (DistributedSampler), gradients are averaged by
// DistributedDataParallel while backward runs, rank 0 shows a progress bar and the test accuracy
// after each epoch, and writes one JSON line per epoch to --metrics. Checkpoints (--checkpoint-dir)
// every --checkpoint-every steps and at the end of each epoch; --resume continues exactly. Under
// `shoal run --run-dir DIR`, every rank reports its metrics into DIR/metrics.db (README "Run
// directories and experiment tracking").
//
// With parameter servers instead of all-reduce (one flag):
//
//   shoal run -n 2 --servers 1 -- build/fashion_mnist --mode ps-sync   # or ps-async,
//                                                                     # ps-ssp --staleness 2
//
// the server ranks hold the model and the optimizer (and write the checkpoints: their shards);
// the workers compute gradients.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/autotuner.h"
#include "comm/collectives.h"
#include "comm/straggler_monitor.h"
#include "common/env.h"
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
#include "train/checkpoint.h"
#include "train/ddp.h"
#include "train/ddp/compression_hook.h"
#include "train/distributed_sampler.h"
#include "train/fashion_cnn.h"
#include "train/idx_dataset.h"
#include "train/optim.h"
#include "train/ps_trainer.h"

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
  std::string resume;  // "latest" or a file
  bool noOverlap = false;
  size_t bucketMb = 25;
  std::string saveParams;        // tests: rank 0 writes the final parameters here
  int64_t crashAtStep = -1;      // tests: the last rank kills itself after this step
  int64_t stragglerWindow = 20;  // steps between straggler checks
  int64_t slowRank = -1;         // tests and demos: this rank computes about 3x as long
  bool autotune = false;         // ddp: pick bucket size and overlap over the first steps
  bool quiet = false;
  std::string mode = "ddp";          // ddp | ps-sync | ps-async | ps-ssp
  std::string compression = "none";  // comm/compress/spec.h
  bool pullHalf = false;             // ps modes: parameters pulled as fp16
  int staleness = 2;
};

// A server rank of a parameter-server job: serve until every worker is done.
int serveMain(const Flags& f, World& w) {
  ps::ServerOptions o;
  o.checkpointDir = f.checkpointDir;
  o.checkpointEvery = f.checkpointEvery;
  o.keep = f.keep;
  o.replicas = w.psReplicas;  // shoal run --ps-replicas
  o.resume = !f.resume.empty();
  if (o.resume && f.resume != "latest") {
    SHOAL_THROW(InvalidArgument, "--resume: parameter servers resume from 'latest' only");
  }
  auto r = ps::serve(*w.group, w.roleRank, w.numServers, w.size - w.numServers, o);
  if (!f.quiet) {
    fmt::print("parameter server {}: {} pushes, {} pulls, {} refused, largest lead {} steps{}\n",
               w.roleRank, r.pushes, r.pulls, r.refused, r.maxLead,
               r.lastCheckpoint.empty() ? "" : ", last checkpoint " + r.lastCheckpoint);
  }
  return 0;
}

// The fraction of the test set classified right: each rank scores its strided share, the
// counts are summed over ranks.
double testAccuracy(comm::Group& g, train::FashionCnn& model, const train::IdxDataset& test) {
  torch::NoGradGuard noGrad;
  model->eval();
  int64_t counts[2] = {0, 0};  // correct, total
  const int64_t n = test.size();
  auto mine = torch::arange(g.rank(), n, g.size(), torch::kInt64);
  for (int64_t at = 0; at < mine.size(0); at += 250) {
    auto idx = mine.slice(0, at, std::min<int64_t>(at + 250, mine.size(0)));
    auto pred = model->forward(test.images.index_select(0, idx)).argmax(1);
    counts[0] += pred.eq(test.labels.index_select(0, idx)).sum().item<int64_t>();
    counts[1] += idx.size(0);
  }
  model->train();
  comm::allreduce(g, counts, 2, DataType::kInt64, ReduceOp::kSum);
  return static_cast<double>(counts[0]) / static_cast<double>(counts[1]);
}

class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t epoch, int64_t epochs, int64_t steps)
      : enabled_(enabled), tty_(::isatty(1)), epoch_(epoch), epochs_(epochs), steps_(steps) {}

  void update(int64_t step, int64_t samples, double loss) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double rate = elapsed > 0 ? samples / elapsed : 0;
    const double eta = step > 0 ? elapsed * (steps_ - step) / step : 0;
    const int width = 30, filled = static_cast<int>(width * step / std::max<int64_t>(steps_, 1));
    std::string line =
        fmt::format("epoch {}/{} [{}{}] {:>3}% {:>7.0f} samples/s loss {:.4f} ETA {:.0f}s",
                    epoch_ + 1, epochs_, std::string(filled, '#'), std::string(width - filled, '.'),
                    100 * step / std::max<int64_t>(steps_, 1), rate, loss, eta);
    // On a terminal the bar redraws in place; in a pipe (shoal run forwards lines) it prints a
    // line at every fifth of the epoch.
    if (tty_) {
      std::printf("\r%s", line.c_str());
      if (step == steps_) std::printf("\n");
    } else if (step == steps_ || step * 5 / steps_ != (step - 1) * 5 / steps_) {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
  }

 private:
  bool enabled_, tty_;
  int64_t epoch_, epochs_, steps_;
  Clock::time_point start_ = Clock::now();
};

int trainMain(const Flags& f) {
  train::keepFreedMemoryForReuse();
#ifdef SHOAL_HAVE_MPI
  World w = initWithMpi();
#else
  World w = init();
#endif
  const bool usePs = f.mode != "ddp";
  if (usePs && w.numServers == 0) {
    SHOAL_THROW(InvalidArgument,
                "--mode {} needs parameter servers: start the job with shoal run -n N --servers K",
                f.mode);
  }
  if (!usePs && w.numServers > 0) {
    SHOAL_THROW(InvalidArgument,
                "the job has {} parameter servers but --mode is ddp: pass --mode ps-sync, "
                "ps-async or ps-ssp",
                w.numServers);
  }
  if (w.role == run::Role::kServer) return serveMain(f, w);
  // The workers' own group (evaluation, loss): the world includes the servers.
  const int numWorkers = w.size - w.numServers;
  std::shared_ptr<comm::Group> workers =
      usePs ? w.group->connect("workers", w.roleRank, numWorkers) : w.group;
  comm::Group& g = *workers;
  const bool lead = g.rank() == 0;
  // The metrics file is opened (by the lead, which writes it) before anything is trained, and
  // every rank learns whether that worked: an unwritable path is a configuration error now, not
  // a silent loss after the first epoch.
  std::ofstream metrics;
  if (!f.metrics.empty()) {
    int opened = 1;
    int err = 0;
    if (lead) {
      metrics.open(f.metrics, std::ios::app);
      err = errno;
      opened = metrics.is_open() ? 1 : 0;
    }
    comm::broadcast(g, &opened, 1, DataType::kInt32, 0);
    if (!opened) {
      SHOAL_THROW(InvalidArgument, "--metrics {}: cannot be opened for writing{}", f.metrics,
                  lead ? fmt::format(" ({})", std::strerror(err)) : std::string(" on rank 0"));
    }
  }
  torch::set_num_threads(f.threads);
  torch::manual_seed(f.seed);  // the same initial model everywhere (rank 0's is broadcast anyway)

  auto trainSet = train::readIdxDataset(f.dataDir, "train");
  auto testSet = train::readIdxDataset(f.dataDir, "t10k");
  trainSet = trainSet.first(f.trainSubset);

  train::FashionCnn model;
  train::OptimizerOptions oo;
  oo.kind = train::parseOptimizer(f.optimizer);
  oo.lr = f.lr;
  train::DistributedSampler sampler(trainSet.size(), g.rank(), g.size(), {.seed = f.seed});
  const int64_t totalSteps = f.lrDecay == "cosine" ? f.epochs * sampler.batches(f.batch) : 0;
  ps::TrainingConfig pc;  // parameter-server modes: what the servers apply
  if (usePs) {
    pc.mode = ps::parseMode(f.mode);
    pc.staleness = f.staleness;
    pc.optimizer = oo;
    pc.linearScaling = f.lrScaling;
    pc.warmupSteps = f.warmupSteps;
    pc.totalSteps = totalSteps;
  }
  // Linear scaling multiplies the rate by the world size, or, with --reference-batch, by how many
  // reference batches the global batch holds (warm-up then starts from the reference's rate).
  int scale = g.size();
  if (f.referenceBatch > 0) {
    const int64_t global = f.batch * g.size();
    SHOAL_CHECK(global % f.referenceBatch == 0,
                "--reference-batch {} must divide the global batch {}", f.referenceBatch, global);
    scale = static_cast<int>(global / f.referenceBatch);
  }
  const LrSchedule schedule = usePs
                                  ? pc.schedule(g.size())
                                  : LrSchedule(f.lr, scale, f.lrScaling, f.warmupSteps, totalSteps);

  std::optional<train::DistributedDataParallel> ddp;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<train::PsTrainer> psTrainer;
  if (usePs) {
    ps::ClientOptions client;
    client.compression = compress::CompressionSpec::parse(f.compression);
    client.pullHalf = f.pullHalf;
    client.replicas = w.psReplicas;
    psTrainer = std::make_unique<train::PsTrainer>(*w.group, w.roleRank, numWorkers, w.numServers,
                                                   *model, pc, client);
  } else {
    train::DdpOptions ddpOptions;
    ddpOptions.overlap = !f.noOverlap;
    ddpOptions.bucketBytes = f.bucketMb << 20;
    ddpOptions.commHook =
        train::ddp::compressionHook(compress::CompressionSpec::parse(f.compression));
    ddp.emplace(model.ptr(), w.group, ddpOptions);
    optimizer = train::makeOptimizer(model->parameters(), oo);
  }
  // What a synchronized step really sent, for the epoch lines.
  auto sentPerStep = [&]() -> std::string {
    if (psTrainer) {
      const auto t = psTrainer->traffic();
      if (t.pushes == 0) return "";
      return fmt::format(", pushed {:.2f} MiB/step", static_cast<double>(t.pushedBytes) /
                                                         static_cast<double>(t.pushes) / (1 << 20));
    }
    if (!ddp || ddp->stats().steps == 0) return "";
    const auto s = ddp->stats();
    return fmt::format(", sent {:.2f} MiB/step",
                       static_cast<double>(s.bytesSent) / static_cast<double>(s.steps) / (1 << 20));
  };

  // Parameter servers write their own (shard) checkpoints; workers only in ddp mode.
  std::optional<train::Checkpointer> checkpoints;
  if (!f.checkpointDir.empty() && !usePs) checkpoints.emplace(f.checkpointDir, f.keep);
  train::Progress at;
  // Dropout differs per rank: its own stream (restored exactly on resume).
  torch::manual_seed(f.seed * 7919 + static_cast<uint64_t>(g.rank()) + 1);
  if (psTrainer) {
    const int64_t steps = sampler.batches(f.batch);
    at.step = psTrainer->startStep();
    at.epoch = at.step / steps;
    at.batchInEpoch = at.step % steps;
    if (lead && at.step > 0) {
      fmt::print("resumed from the parameter servers: epoch {}, batch {}, step {}\n", at.epoch + 1,
                 at.batchInEpoch, at.step);
    }
  } else if (!f.resume.empty()) {
    SHOAL_CHECK(checkpoints.has_value(), "--resume needs --checkpoint-dir");
    std::string path = f.resume;
    if (path == "latest") {
      auto latest = checkpoints->latest();
      if (!latest) SHOAL_THROW(InvalidArgument, "--resume: no checkpoint in {}", f.checkpointDir);
      path = *latest;
    }
    at = checkpoints->load(g, path, *model, *optimizer);
    if (lead)
      fmt::print("resumed from {}: epoch {}, batch {}, step {}\n", path, at.epoch + 1,
                 at.batchInEpoch, at.step);
  }
  if (lead && !f.quiet) {
    fmt::print(
        "fashion_mnist: {} {} ({}), batch {} per rank, {} lr {}{}, {} epochs, {} "
        "training samples\n",
        g.size(),
        usePs ? fmt::format("workers and {} parameter servers ({}{})", w.numServers, f.mode,
                            f.mode == "ps-ssp" ? fmt::format(", staleness {}", f.staleness) : "")
              : std::string("ranks"),
        toString(w.launcher), f.batch, f.optimizer, schedule.target(),
        f.warmupSteps ? fmt::format(" (warm-up {} steps)", f.warmupSteps) : "", f.epochs,
        trainSet.size());
  }

  // Under `shoal run --run-dir`: every rank's metrics into the run's store (the dashboard's
  // curves), its CPU and memory every second.
  std::optional<track::Tracker> tracker;
  std::optional<track::SystemSampler> systemSampler;
  if (auto dir = run::runDirectoryFromEnv()) {
    tracker.emplace(track::TrackerOptions{.path = run::metricsPath(*dir), .rank = w.rank});
    systemSampler.emplace(*tracker,
                          track::SystemSamplerOptions{.interval = std::chrono::seconds(1)});
  }
  double commSeconds = 0;  // DDP's wait for the last buckets, so far
  // Which rank is slow, and in what: one all-gather of two numbers every window.
  comm::StragglerMonitor stragglers(
      workers, {.phases = {"compute", "data"}, .window = static_cast<int>(f.stragglerWindow)});

  // --autotune: DDP's bucket size and overlap, by successive halving over the first steps; each
  // candidate is a DDP rebuilt over the same model (training goes on meanwhile: every
  // configuration computes the same average).
  struct DdpChoice {
    size_t bucketMb;
    bool overlap;
  };
  std::vector<DdpChoice> choices;
  std::optional<comm::Autotuner> tuner;
  size_t applied = choices.max_size();
  auto applyChoice = [&](size_t c) {
    train::DdpOptions o;
    o.overlap = choices[c].overlap;
    o.bucketBytes = choices[c].bucketMb << 20;
    o.commHook = train::ddp::compressionHook(compress::CompressionSpec::parse(f.compression));
    ddp.emplace(model.ptr(), w.group, o);
    commSeconds = 0;
    applied = c;
  };
  if (f.autotune && ddp) {
    std::vector<std::string> labels;
    for (size_t mb : {1, 4, 25}) {
      for (bool overlap : {true, false}) {
        choices.push_back({mb, overlap});
        labels.push_back(fmt::format("bucket={}MiB overlap={}", mb, overlap ? "on" : "off"));
      }
    }
    tuner.emplace(workers, labels);
  }

  const auto jobStart = Clock::now();
  for (int64_t epoch = at.epoch; epoch < f.epochs; ++epoch) {
    auto order = sampler.indices(epoch);
    auto orderTensor =
        torch::from_blob(order.data(), {static_cast<int64_t>(order.size())}, torch::kInt64);
    const int64_t steps = sampler.batches(f.batch);
    ProgressBar bar(lead && !f.quiet, epoch, f.epochs, steps);
    const auto epochStart = Clock::now();
    double lossSum = 0;
    int64_t samples = 0;
    for (int64_t b = epoch == at.epoch ? at.batchInEpoch : 0; b < steps; ++b) {
      const auto dataStart = Clock::now();
      auto idx =
          orderTensor.slice(0, b * f.batch, std::min<int64_t>((b + 1) * f.batch, order.size()));
      auto x = trainSet.images.index_select(0, idx);
      auto y = trainSet.labels.index_select(0, idx);
      torch::Tensor loss;
      if (tuner && !tuner->done() && tuner->current() != applied) applyChoice(tuner->current());
      const auto stepStart = Clock::now();
      if (psTrainer) {
        model->zero_grad();
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        loss.backward();
        psTrainer->step(at.step);
      } else {
        train::setLearningRate(*optimizer, schedule.at(at.step));
        optimizer->zero_grad();
        ddp->beforeForward();
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        ddp->backward(loss);
        optimizer->step();
      }
      if (g.rank() == f.slowRank) {
        torch::NoGradGuard noGrad;
        for (int i = 0; i < 6; ++i) model->forward(x);
      }
      ++at.step;
      const double batchLoss = loss.item<double>();
      lossSum += batchLoss * idx.size(0);
      samples += idx.size(0);
      const double stepSeconds = std::chrono::duration<double>(Clock::now() - stepStart).count();
      const double dataSeconds = std::chrono::duration<double>(stepStart - dataStart).count();
      double commWait = 0;
      if (ddp) {
        const double waited = ddp->stats().finishSeconds;
        commWait = waited - commSeconds;
        commSeconds = waited;
      }
      if (tuner && tuner->record(stepSeconds)) {
        if (tuner->best() != applied) applyChoice(tuner->best());
        if (lead) {
          fmt::print("autotune: {}\n", tuner->describe());
          std::fflush(stdout);
        }
        if (tracker) tracker->log("autotune_choice", at.step, static_cast<double>(tuner->best()));
      }
      const double phases[2] = {std::max(0.0, stepSeconds - commWait), dataSeconds};
      const auto verdict = stragglers.step(phases);
      if (tracker) {
        tracker->log("loss", at.step, batchLoss);
        tracker->log("step_time_s", at.step, stepSeconds);
        tracker->log("samples_per_s", at.step, static_cast<double>(idx.size(0)) / stepSeconds);
        tracker->log("lr", at.step, schedule.at(at.step));
        if (ddp) tracker->log("comm_wait_s", at.step, commWait);
        if (verdict && verdict->medians[0] > 0) {
          tracker->log("compute_ratio", at.step, verdict->means[0][g.rank()] / verdict->medians[0]);
        }
      }
      bar.update(b + 1, samples * g.size(), lossSum / samples);
      if (checkpoints && f.checkpointEvery > 0 && at.step % f.checkpointEvery == 0) {
        checkpoints->save(g, *model, *optimizer, {epoch, b + 1, at.step});
      }
      if (at.step == f.crashAtStep && g.rank() == g.size() - 1) {
        std::fflush(stdout);
        ::raise(SIGKILL);  // a test's stand-in for a machine that dies
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - epochStart).count();
    // Loss over every rank's samples of the epoch.
    double sums[2] = {lossSum, static_cast<double>(samples)};
    comm::allreduce(g, sums, 2, DataType::kFloat64, ReduceOp::kSum);
    // Asynchronous workers hold slightly different copies: evaluate the servers' latest.
    if (psTrainer) psTrainer->refresh(at.step);
    const double accuracy = testAccuracy(g, model, testSet);
    if (checkpoints) checkpoints->save(g, *model, *optimizer, {epoch + 1, 0, at.step});
    if (tracker && lead) {
      tracker->log("epoch_loss", at.step, sums[0] / std::max(sums[1], 1.0));
      tracker->log("test_accuracy", at.step, accuracy);
      tracker->log("job_samples_per_s", at.step, sums[1] / seconds);
    }
    if (lead) {
      if (!f.quiet) {
        fmt::print(
            "epoch {}/{}: loss {:.4f}, test accuracy {:.2f}%, {:.1f} s, {:.0f} samples/s{}\n",
            epoch + 1, f.epochs, sums[0] / std::max(sums[1], 1.0), 100 * accuracy, seconds,
            sums[1] / seconds, sentPerStep());
        std::fflush(stdout);
      }
      if (metrics.is_open()) {
        metrics << nlohmann::json{{"epoch", epoch + 1},
                                  {"step", at.step},
                                  {"ranks", g.size()},
                                  {"loss", sums[0] / std::max(sums[1], 1.0)},
                                  {"test_accuracy", accuracy},
                                  {"epoch_seconds", seconds},
                                  {"samples_per_second", sums[1] / seconds},
                                  {"lr", schedule.at(at.step)},
                                  {"elapsed_seconds",
                                   std::chrono::duration<double>(Clock::now() - jobStart).count()}}
                       .dump()
                << "\n";
        metrics.flush();
        if (!metrics) SHOAL_THROW(SystemError, "--metrics {}: writing failed", f.metrics);
      }
    }
  }
  if (psTrainer) psTrainer->finish();
  if (lead && !f.saveParams.empty()) {
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
                 "sgd, adam, rmsprop, or the layer-wise lamb and lars (ddp mode only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "rmsprop", "lamb", "lars"}));
  numbers.number(app, "--lr", f.lr, 1e-12, 1e3,
                 "learning rate (per rank's batch; see --lr-scaling)");
  numbers.integer(app, "--batch", f.batch, 1, 1 << 20, "samples per rank per step");
  numbers.integer(app, "--epochs", f.epochs, 1, 10000, "epochs");
  app.add_flag("--lr-scaling", f.lrScaling, "multiply the learning rate by the world size");
  numbers.integer(app, "--reference-batch", f.referenceBatch, 0, 1 << 30,
                  "with --lr-scaling (ddp): multiply by global batch / this instead (0: off)");
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
  app.add_option("--checkpoint-dir", f.checkpointDir);
  numbers.integer(app, "--checkpoint-every", f.checkpointEvery, 0, kMaxSteps,
                  "steps between checkpoints (0: epochs only)");
  numbers.integer(app, "--keep", f.keep, 1, 1000, "checkpoints kept");
  app.add_option("--resume", f.resume, "'latest' or a checkpoint file");
  app.add_flag("--no-overlap", f.noOverlap, "all-reduce after backward instead of during it");
  numbers.integer(app, "--bucket-mb", f.bucketMb, 1, 4096, "gradient bucket size in MiB");
  app.add_option("--save-params", f.saveParams, "write the final parameters (tests)");
  numbers.integer(app, "--straggler-window", f.stragglerWindow, 1, 1 << 20,
                  "steps between straggler checks (a slow rank is named after two slow windows)");
  app.add_flag("--autotune", f.autotune,
               "ddp: try bucket sizes 1, 4, 25 MiB with and without overlap over the first "
               "steps (successive halving) and keep the fastest");
  numbers.integer(app, "--slow-rank", f.slowRank, 0, 1 << 20,
                  "make this rank compute about 3x as long (to see straggler detection)");
  numbers.integer(app, "--crash-at-step", f.crashAtStep, 1, kMaxSteps,
                  "the last rank kills itself after this step (tests)");
  app.add_flag("-q,--quiet", f.quiet, "no progress output");
  app.add_option("--mode", f.mode,
                 "ddp (all-reduce), or through parameter servers (shoal run --servers K): "
                 "ps-sync, ps-async, ps-ssp")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "ps-sync", "ps-async", "ps-ssp"}));
  app.add_option("--compression", f.compression,
                 "gradient compression: none, fp16, bf16, topk:DENSITY, powersgd:RANK (ddp), "
                 "onebit; optionally ,warmup=STEPS (steps sent uncompressed first)")
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
