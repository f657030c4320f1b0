// A rank program for the parameter-server tests, started by `shoal run -n W --servers S`.
// Server ranks serve; worker ranks run the scenario and print one verdict line.
//
//   ps_worker sums [--pushes N] [--dir D --kill-server-at K]
//                                          async, lr 1: every worker pushes known gradients N
//                                          times (some per key); the pulled values must be the
//                                          exact sums: "sums exact over K elements"; worker 0
//                                          SIGKILLs server 1 at its push K (replicated shards;
//                                          --kill-servers S1,S2 kills those instead)
//   ps_worker staleness --mode M --staleness S
//                                          the last worker is slow; prints the largest lead of
//                                          each worker: "lead max L (staleness S)"
//   ps_worker reject                       worker 1 pushes a wrong shape and a wrong dtype,
//                                          which must be refused, then all train on: "reject ok"
//   ps_worker reference --mode M --optimizer O [--steps N]
//                                          known gradients, whole or key by key; every worker
//                                          computes what the servers must hold with the
//                                          reference kernels (ps/server_optimizer.h) and compares
//                                          what it pulls bit for bit (asynchronous: the workers
//                                          push in turn): "reference exact over K elements"
//   ps_worker train --dir D [--steps N] [--kill-server-at K] [--fail-worker-at K] [--resume]
//                   [--compression SPEC]   deterministic synchronous training with shard
//                                          checkpoints every 5 steps (and the workers' error-
//                                          feedback residuals with them); worker 0 SIGKILLs server
//                                          1 after step K; --fail-worker-at: the last worker throws
//                                          after step K; prints "final digest X" (and with
//                                          replicated shards "failovers F")
//                          [--await-replacement] [--kill-again-at K2 --kill-again S1,S2]
//                                          (shoal run --ps-replacements): after the kill, worker
//                                          0 waits until the killed servers' replacements
//                                          started, trains on, and SIGKILLs servers S after
//                                          step K2 (by then the replacements must hold copies)
// Shards are replicated when the job is (shoal run --ps-replicas 2).
// Errors are printed as "ERROR <Type>: <message>" (exit 1).
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "ps/client.h"
#include "ps/replacement.h"
#include "ps/server.h"
#include "ps/server_optimizer.h"
#include "run/init.h"
#include "tests/process_util.h"

using namespace shoal;

namespace {

struct Args {
  std::string scenario;
  std::string dir;
  std::string mode = "sync";
  std::string optimizer = "sgd";
  int staleness = 0;
  int pushes = 2000;
  int steps = 30;
  int killServerAt = -1;
  int failWorkerAt = -1;
  std::vector<int> killServers{1};  // which servers --kill-server-at kills
  bool awaitReplacement = false;
  int killAgainAt = -1;
  std::vector<int> killAgain;
  bool resume = false;
  std::string compression = "none";  // train: the pushes' (ps::ClientOptions)
  int replicas = 1;                  // the job's (World::psReplicas)
};

std::vector<int> parseServers(const std::string& list) {
  std::vector<int> servers;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    servers.push_back(std::stoi(list.substr(at, comma - at)));
    at = comma + 1;
  }
  return servers;
}

Args parse(int argc, char** argv) {
  Args a;
  a.scenario = argc > 1 ? argv[1] : "";
  for (int i = 2; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "{} needs a value", f);
      return std::string(argv[++i]);
    };
    if (f == "--dir")
      a.dir = next();
    else if (f == "--mode")
      a.mode = next();
    else if (f == "--optimizer")
      a.optimizer = next();
    else if (f == "--staleness")
      a.staleness = std::stoi(next());
    else if (f == "--pushes")
      a.pushes = std::stoi(next());
    else if (f == "--steps")
      a.steps = std::stoi(next());
    else if (f == "--kill-server-at")
      a.killServerAt = std::stoi(next());
    else if (f == "--fail-worker-at")
      a.failWorkerAt = std::stoi(next());
    else if (f == "--kill-servers")
      a.killServers = parseServers(next());
    else if (f == "--await-replacement")
      a.awaitReplacement = true;
    else if (f == "--kill-again-at")
      a.killAgainAt = std::stoi(next());
    else if (f == "--kill-again")
      a.killAgain = parseServers(next());
    else if (f == "--resume")
      a.resume = true;
    else if (f == "--compression")
      a.compression = next();
    else
      SHOAL_THROW(InvalidArgument, "unknown flag {}", f);
  }
  return a;
}

constexpr int kTrainCheckpointEvery = 5;

ps::TrainingConfig sgd(ps::Mode mode, double lr, double momentum, int staleness = 0) {
  ps::TrainingConfig c;
  c.mode = mode;
  c.staleness = staleness;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = lr;
  c.optimizer.momentum = momentum;
  return c;
}

ps::ClientOptions clientOptions(const Args& a) {
  ps::ClientOptions o;
  o.replicas = a.replicas;
  o.compression = compress::CompressionSpec::parse(a.compression);
  if (a.scenario == "train") {
    // The servers' (main below): the workers' residuals are saved beside their checkpoints.
    o.checkpointDir = a.dir + "/checkpoints";
    o.checkpointEvery = kTrainCheckpointEvery;
  }
  return o;
}

// SIGKILLs `servers` (the newest process of each: a replacement writes its pid too).
void killServers(const Args& a, const std::vector<int>& servers, const std::string& when) {
  for (int server : servers) {
    const std::string pid = test::readFile(fmt::format("{}/server-{}.pid", a.dir, server));
    std::printf("killing parameter server %d (pid %s) %s\n", server, pid.c_str(), when.c_str());
    std::fflush(stdout);
    ::kill(std::stoi(pid), SIGKILL);
  }
}

// Worker 0 starts the servers from zeros; everyone then has the values of step `start`.
void start(ps::Client& c, std::vector<float>& values) {
  if (c.mustInitialize()) c.initialize(values.data());
  c.pull(values.data(), c.startStep())->wait();
}

// Waits for the oldest call; if it failed, waits for the others too before throwing, so that
// no call still reads a buffer the caller is about to free.
void waitOrDrain(const std::vector<std::shared_ptr<comm::Work>>& inflight) {
  try {
    inflight.front()->wait();
  } catch (...) {
    for (const auto& w : inflight) {
      try {
        w->wait();
      } catch (const std::exception&) {
        // The first failure is the one reported.
      }
    }
    throw;
  }
}

int sums(comm::Group& world, int me, int workers, const Args& a) {
  std::vector<ps::KeySpec> keys{{"big", {20000}}, {"b", {7}}, {"m", {30, 3}}};
  ps::Client c(world, me, workers, world.size() - workers, keys, sgd(ps::Mode::kAsync, 1.0, 0),
               clientOptions(a));
  const size_t n = c.partition().totalElements();
  std::vector<float> values(n, 0.0f), grads(n);
  for (size_t i = 0; i < n; ++i) grads[i] = -static_cast<float>((me + 1) + static_cast<int>(i % 5));
  start(c, values);
  // Many pushes in flight at once, every fourth step key by key.
  std::vector<std::shared_ptr<comm::Work>> inflight;
  for (int t = 0; t < a.pushes; ++t) {
    if (me == 0 && t == a.killServerAt) killServers(a, a.killServers, fmt::format("at push {}", t));
    if (t % 4 == 3) {
      size_t at = 0;
      for (const auto& k : keys) {
        inflight.push_back(c.pushKey(k.name, grads.data() + at, DataType::kFloat32, k.shape, t));
        at += k.numel();
      }
    } else {
      inflight.push_back(c.push(grads.data(), t));
    }
    if (inflight.size() > 16) {
      waitOrDrain(inflight);
      inflight.erase(inflight.begin());
    }
  }
  while (!inflight.empty()) {
    waitOrDrain(inflight);
    inflight.erase(inflight.begin());
  }
  // Every worker's pushes are in before anyone reads.
  auto peers = world.connect("ps-test-workers", me, workers);
  comm::barrier(*peers);
  c.pull(values.data(), a.pushes)->wait();
  c.finish();
  for (size_t i = 0; i < n; ++i) {
    const double expected = static_cast<double>(a.pushes) *
                            (workers * (workers + 1) / 2.0 + workers * static_cast<double>(i % 5));
    if (values[i] != expected) {
      std::printf("WRONG sum at %zu: %.1f, expected %.1f\n", i, values[i], expected);
      return 1;
    }
  }
  std::printf("sums exact over %zu elements after %d pushes from each of %d workers\n", n, a.pushes,
              workers);
  if (a.replicas > 1) std::printf("failovers %lu\n", static_cast<unsigned long>(c.failovers()));
  return 0;
}

int staleness(comm::Group& world, int me, int workers, const Args& a) {
  std::vector<ps::KeySpec> keys{{"w", {1000}}};
  ps::Client c(world, me, workers, world.size() - workers, keys,
               sgd(ps::parseMode(a.mode), 0.01, 0, a.staleness), clientOptions(a));
  std::vector<float> values(1000, 0.0f), grads(1000, 0.001f);
  start(c, values);
  for (int t = c.startStep(); t < a.steps; ++t) {
    if (me == workers - 1) std::this_thread::sleep_for(std::chrono::milliseconds(15));
    c.pushPull(grads.data(), values.data(), t)->wait();
  }
  c.finish();
  int64_t most = 0;
  for (int64_t l : c.leads()) most = std::max(most, l);
  std::printf("lead max %ld (staleness %d)\n", static_cast<long>(most), a.staleness);
  return 0;
}

int reject(comm::Group& world, int me, int workers, const Args& a) {
  std::vector<ps::KeySpec> keys{{"w", {4, 5}}, {"v", {3}}};
  ps::Client c(world, me, workers, world.size() - workers, keys, sgd(ps::Mode::kSync, 0.1, 0),
               clientOptions(a));
  std::vector<float> values(23, 0.0f), grads(23, static_cast<float>(me + 1));
  start(c, values);
  const int steps = 5;
  for (int t = 0; t < steps; ++t) {
    if (me == 1 && t == 2) {
      auto expectRefused = [&](DataType dtype, std::vector<int64_t> shape, const char* expected) {
        std::vector<double> data(20, 1.0);
        try {
          c.pushKey("w", data.data(), dtype, shape, t)->wait();
          std::printf("WRONG: a push of %s was accepted\n", expected);
          std::exit(1);
        } catch (const InvalidArgument& e) {
          if (!std::strstr(e.what(), expected)) {
            std::printf("WRONG message: %s\n", e.what());
            std::exit(1);
          }
          std::printf("refused as expected: %s\n", e.what());
        }
      };
      expectRefused(DataType::kFloat32, {5, 4}, "key 'w' is float32 [4, 5]; got float32 [5, 4]");
      expectRefused(DataType::kFloat64, {4, 5}, "key 'w' is float32 [4, 5]; got float64 [4, 5]");
    }
    c.pushPull(grads.data(), values.data(), t)->wait();
  }
  c.finish();
  // Each step subtracts lr x the mean gradient (the mean of 1..workers).
  const float expected = -0.1f * steps * (workers + 1) / 2.0f;
  for (float v : values) {
    if (std::fabs(v - expected) > 1e-5f) {
      std::printf("WRONG value %.7f, expected %.7f\n", v, expected);
      return 1;
    }
  }
  std::printf("reject ok\n");
  return 0;
}

// The gradient worker w pushes at step t: irregular values, so rounding shows. One copy of
// the code (not inlined) for the pushing worker and the reference alike: inlined copies could
// contract the arithmetic differently (FMA) and differ in the last bit.
[[gnu::noinline]] void knownGradient(int w, int t, std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = std::sin(0.013f * static_cast<float>(i) + 0.7f * static_cast<float>(w) +
                    0.31f * static_cast<float>(t)) *
           (1.0f + static_cast<float>((i + static_cast<size_t>(w)) % 7));
  }
}

int reference(comm::Group& world, int me, int workers, const Args& a) {
  std::vector<ps::KeySpec> keys{{"w", {301, 7}}, {"b", {13}}, {"e", {5003}}};
  ps::TrainingConfig config;
  config.mode = ps::parseMode(a.mode);
  config.staleness = 1;
  config.optimizer.kind = parseOptimizer(a.optimizer == "momentum" ? "sgd" : a.optimizer);
  config.optimizer.lr = config.optimizer.kind == OptimizerKind::kSgd ? 0.05 : 1e-3;
  config.optimizer.momentum = a.optimizer == "momentum" || a.optimizer == "rmsprop" ? 0.9 : 0;
  config.optimizer.weightDecay = a.optimizer == "momentum" || a.optimizer == "adam" ? 1e-3 : 0;
  config.warmupSteps = 2;
  config.totalSteps = a.steps + 2;
  config.linearScaling = true;
  ps::Client c(world, me, workers, world.size() - workers, keys, config, clientOptions(a));
  const bool sync = config.mode == ps::Mode::kSync;
  const size_t n = c.partition().totalElements();
  std::vector<float> values(n, 0.0f), grads(n);
  // What the servers must hold, computed here with the servers' own kernels.
  std::vector<float> expected(n, 0.0f), s0(n, 0.0f), s1(n, 0.0f), g(n), other(n);
  const int slots = ps::optimizerStateSlots(config.optimizer);
  const LrSchedule schedule = config.schedule(workers);
  int64_t updates = 0;
  auto apply = [&](const float* grad, float scale, double lr) {
    ++updates;
    ps::applyUpdate(config.optimizer, lr, updates, scale, grad, expected.data(),
                    slots >= 1 ? s0.data() : nullptr, slots >= 2 ? s1.data() : nullptr, n);
  };
  start(c, values);
  auto peers = world.connect("ps-test-workers", me, workers);
  auto check = [&](int t) {
    if (std::memcmp(values.data(), expected.data(), n * sizeof(float)) == 0) return true;
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(&values[i], &expected[i], sizeof(float)) != 0) {
        std::printf("WRONG after step %d at %zu: %.9g, expected %.9g\n", t, i, values[i],
                    expected[i]);
        break;
      }
    }
    return false;
  };
  for (int t = 0; t < a.steps; ++t) {
    knownGradient(me, t, grads);
    // Odd steps key by key (one piece per request), even steps the whole model at once.
    auto pushKeys = [&] {
      size_t at = 0;
      std::vector<std::shared_ptr<comm::Work>> works;
      for (const auto& k : keys) {
        works.push_back(c.pushKey(k.name, grads.data() + at, DataType::kFloat32, k.shape, t));
        at += k.numel();
      }
      for (auto& w : works) w->wait();
    };
    auto push = [&] {
      if (t % 2 == 0) return c.pushPull(grads.data(), values.data(), t)->wait();
      pushKeys();
      c.pull(values.data(), t + 1)->wait();
    };
    if (sync) {
      if (t % 2 == 0) {
        push();  // all at once: whoever arrives last
      } else {
        // In turn: the last worker's pushes always complete the step, so they are applied as
        // they arrive, deterministically.
        for (int turn = 0; turn < workers; ++turn) {
          if (turn == me) pushKeys();
          comm::barrier(*peers);
        }
        c.pull(values.data(), t + 1)->wait();
      }
      // The average in worker order, as the servers reduce it.
      knownGradient(0, t, g);
      for (int w = 1; w < workers; ++w) {
        knownGradient(w, t, other);
        for (size_t i = 0; i < n; ++i) g[i] += other[i];
      }
      apply(g.data(), 1.0f / static_cast<float>(workers), schedule.at(t));
      if (!check(t)) return 1;
    } else {
      // In turn, so the order of the updates is known.
      for (int turn = 0; turn < workers; ++turn) {
        if (turn == me) push();
        comm::barrier(*peers);
        knownGradient(turn, t, g);
        apply(g.data(), 1.0f, schedule.at(t));
        if (turn == me && !check(t)) return 1;  // what it pulled right after its own push
      }
    }
  }
  comm::barrier(*peers);
  c.pull(values.data(), a.steps)->wait();
  c.finish();
  if (!check(a.steps)) return 1;
  std::printf("reference exact over %zu elements after %d steps\n", n, a.steps);
  return 0;
}

uint64_t digest(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Waits (on the store, bounded) until each killed server's replacement counted itself in for
// both of its copies (Note [Replacement servers] in ps/replacement.h): training then goes on,
// and the next step boundaries hand the shards over.
void awaitReplacements(comm::Group& world, int workers, const Args& a) {
  const int servers = world.size() - workers;
  std::vector<std::string> keys;
  for (int s : a.killServers) {
    keys.push_back(ps::replacementKey(s, /*backup=*/false));
    keys.push_back(ps::replacementKey((s + servers - 1) % servers, /*backup=*/true));
  }
  comm::nativeEngine(world).store().wait(keys, world.options().timeout);
  std::printf("replacements of servers started\n");
  std::fflush(stdout);
}

int train(comm::Group& world, int me, int workers, const Args& a) {
  std::vector<ps::KeySpec> keys{{"a", {40000}}, {"b", {10}}};
  ps::Client c(world, me, workers, world.size() - workers, keys, sgd(ps::Mode::kSync, 0.05, 0.9),
               clientOptions(a));
  const size_t n = c.partition().totalElements();
  std::vector<float> values(n, 0.0f), grads(n);
  start(c, values);
  if (c.startStep() > 0) std::printf("worker %d resumes at step %ld\n", me, c.startStep());
  for (int t = c.startStep(); t < a.steps; ++t) {
    // A quadratic pull towards a per-worker target: the gradient depends on the values, so the
    // result depends on every step being applied exactly once.
    for (size_t i = 0; i < n; ++i) {
      const float target = std::sin(0.01f * static_cast<float>(i) + static_cast<float>(me));
      grads[i] = (values[i] - target) * (1.0f + 0.1f * static_cast<float>(t % 3));
    }
    c.pushPull(grads.data(), values.data(), t)->wait();
    if (me == 0 && t == a.killServerAt) {
      killServers(a, a.killServers, fmt::format("after step {}", t));
      if (a.awaitReplacement) awaitReplacements(world, workers, a);
    }
    if (me == 0 && t == a.killAgainAt) {
      killServers(a, a.killAgain, fmt::format("after step {}", t));
    }
    if (me == workers - 1 && t == a.failWorkerAt) {
      SHOAL_THROW(InternalError, "worker {} fails on purpose after step {}", me, t);
    }
  }
  c.finish();
  if (a.replicas > 1) std::printf("failovers %lu\n", static_cast<unsigned long>(c.failovers()));
  std::printf("final digest %016lx\n", static_cast<unsigned long>(digest(values)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    World w;
    try {
      w = init();
    } catch (const InvalidArgument& e) {
      // Configuration (SHOAL_* variables, launcher variables): one line, exit code 2.
      std::printf("ERROR InvalidArgument: %s\n", e.what());
      return 2;
    }
    const int workers = w.size - w.numServers;
    a.replicas = w.psReplicas;
    if (w.role == run::Role::kServer) {
      if (!a.dir.empty()) {
        std::ofstream(fmt::format("{}/server-{}.pid", a.dir, w.roleRank)) << ::getpid();
      }
      ps::ServerOptions o;
      o.replicas = w.psReplicas;
      o.replacement = w.psReplacement > 0;
      if (a.scenario == "train") {
        o.checkpointDir = a.dir + "/checkpoints";
        o.checkpointEvery = kTrainCheckpointEvery;
        o.resume = a.resume;
      }
      auto r = ps::serve(*w.group, w.roleRank, w.numServers, workers, o);
      if (r.replacedNothing) {
        std::printf("server %d: its replacement served nothing (the job ended first)\n",
                    w.roleRank);
      }
      std::printf(
          "server %d: %lu pushes (%lu applied on arrival), %lu pulls (%lu streamed), %lu refused, "
          "max lead %ld, final step %lu\n",
          w.roleRank, static_cast<unsigned long>(r.pushes),
          static_cast<unsigned long>(r.appliedOnArrival), static_cast<unsigned long>(r.pulls),
          static_cast<unsigned long>(r.streamed), static_cast<unsigned long>(r.refused),
          static_cast<long>(r.maxLead), static_cast<unsigned long>(r.finalStep));
      for (const auto& b : r.backups) {
        std::printf("server %d's backup: %lu pushes, %lu pulls, final step %lu\n", w.roleRank,
                    static_cast<unsigned long>(b.pushes), static_cast<unsigned long>(b.pulls),
                    static_cast<unsigned long>(b.finalStep));
      }
      return 0;
    }
    if (a.scenario == "sums") return sums(*w.group, w.roleRank, workers, a);
    if (a.scenario == "staleness") return staleness(*w.group, w.roleRank, workers, a);
    if (a.scenario == "reject") return reject(*w.group, w.roleRank, workers, a);
    if (a.scenario == "train") return train(*w.group, w.roleRank, workers, a);
    if (a.scenario == "reference") return reference(*w.group, w.roleRank, workers, a);
    SHOAL_THROW(InvalidArgument, "unknown scenario '{}'", a.scenario);
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", test::typeName(e), e.what());
    return 1;
  }
}
