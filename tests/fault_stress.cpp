// Fault-injection stress: many random kills and stops of one rank in the middle of a collective,
// checking that every survivor names the victim as the cause (Note [Root cause] in
// comm/native/native_engine.cpp) and fails within the deadline plus 1 s. Not part of ctest's run (a few
// minutes); its result is committed in bench/results/fault_stress.md.
//
//   shoal_fault_stress [--runs N] [--seed S] [--ranks N] [--timeout S] [--out FILE.md]
//
// Each injection: N ranks of tests/worker.cpp loop a random collective over a random transport;
// once every rank printed "ready", a random rank (rank 0 included) gets SIGKILL or SIGSTOP after
// a random delay of 0-20 ms (so the victim is caught at different points of the operation).
// Exit status 0 only if no survivor named a wrong rank, hung, or overran.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "run/local_job.h"
#include "tests/process_util.h"

using namespace shoal;
using namespace std::chrono_literals;

namespace {

const char* kCollectives[] = {"allreduce_ring",   "allreduce_recursive_doubling",
                              "allreduce_driver", "broadcast",
                              "reduce",           "allgather",
                              "reduce_scatter",   "alltoall",
                              "gather",           "scatter",
                              "barrier",          "sendrecv"};

struct Outcome {
  std::string label;
  bool ok = true;
  std::string problem;
  double seconds = 0;
};

int causeOf(const std::string& out) {
  auto at = out.find("CAUSE ");
  if (at == std::string::npos) return -2;
  return std::atoi(out.c_str() + at + 6);
}

Outcome inject(const std::string& coll, const std::string& transport, int sig, int victim,
               int ranks, double timeout, int delayMs) {
  Outcome o;
  o.label = fmt::format("{} {} {} victim {} delay {} ms", coll, transport,
                        sig == SIGKILL ? "SIGKILL" : "SIGSTOP", victim, delayMs);
  test::TempDir dir;
  run::LocalJobOptions opts;
  opts.ranks = ranks;
  opts.argv = {SHOAL_TEST_WORKER, "loop", coll};
  opts.env = {{"SHOAL_TIMEOUT", fmt::format("{}", timeout)}, {"SHOAL_TRANSPORT", transport}};
  opts.outputDir = dir.path;
  run::LocalJob j(opts);
  Deadline ready(60s);
  for (int r = 0; r < ranks; ++r) {
    while (j.output(r).find("ready") == std::string::npos) {
      if (ready.expired()) {
        o.ok = false;
        o.problem = "ranks never became ready";
        return o;
      }
      std::this_thread::sleep_for(5ms);  // polling a log file; not synchronisation of ranks
    }
  }
  // The random delay moves the injection point within the operation.
  std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
  j.signal(victim, sig);
  const auto t0 = Clock::now();
  Deadline hang(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout + 20)));
  for (int r = 0; r < ranks; ++r) {
    if (r == victim) continue;
    std::optional<run::RankExit> e;
    while (!(e = j.poll(r))) {
      if (hang.expired()) {
        o.ok = false;
        o.problem = fmt::format("rank {} hung", r);
        return o;
      }
      std::this_thread::sleep_for(2ms);
    }
    std::string out = j.output(r);
    int cause = causeOf(out);
    if (e->exitCode != 3 || cause != victim ||
        out.find(fmt::format("(cause: rank {})", victim)) == std::string::npos) {
      o.ok = false;
      o.problem += fmt::format("rank {} (exit {}, cause {}): {}\n", r, e->describe(), cause,
                               out.substr(0, 2000));
    }
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double bound = sig == SIGSTOP ? timeout + 1.0 : 1.0 + timeout;
  if (o.seconds > bound) {
    o.ok = false;
    o.problem += fmt::format("survivors took {:.2f} s (bound {:.1f} s)\n", o.seconds, bound);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200, ranks = 4;
  unsigned seed = 1;
  double timeout = 2.0;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") {
      runs = std::stoi(next());
    } else if (a == "--seed") {
      seed = static_cast<unsigned>(std::stoul(next()));
    } else if (a == "--ranks") {
      ranks = std::stoi(next());
    } else if (a == "--timeout") {
      timeout = std::stod(next());
    } else if (a == "--out") {
      out = next();
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (runs < 1 || ranks < 2 || !(timeout > 0.2 && timeout < 600)) {
    std::fprintf(stderr, "need --runs >= 1, --ranks >= 2, --timeout in (0.2, 600)\n");
    return 2;
  }
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  int failed = 0, kills = 0, stops = 0;
  std::map<std::string, int> perCollective;
  double worstKill = 0, worstStop = 0;
  std::string failures;
  for (int i = 0; i < runs; ++i) {
    std::string coll = kCollectives[pick(std::size(kCollectives))];
    std::string transport = pick(2) ? "tcp" : "shm";
    int sig = pick(3) == 0 ? SIGSTOP : SIGKILL;
    int victim = pick(ranks);
    int delay = pick(21);
    Outcome o = inject(coll, transport, sig, victim, ranks, timeout, delay);
    (sig == SIGKILL ? kills : stops)++;
    perCollective[coll]++;
    double& worst = sig == SIGKILL ? worstKill : worstStop;
    worst = std::max(worst, o.seconds);
    std::printf("[%3d/%d] %-62s %s %.2f s\n", i + 1, runs, o.label.c_str(), o.ok ? "ok  " : "FAIL",
                o.seconds);
    if (!o.ok) {
      ++failed;
      failures += fmt::format("- {}: {}\n", o.label, o.problem);
      std::printf("%s", o.problem.c_str());
    }
  }
  std::string summary = fmt::format(
      "{} injections ({} SIGKILL, {} SIGSTOP) over {} collectives x tcp/shm x victims 0..{}, "
      "{} ranks, SHOAL_TIMEOUT={} s, seed {}: {} wrong, hung or late; slowest survivor exit "
      "{:.2f} s after a kill, {:.2f} s after a stop\n",
      runs, kills, stops, perCollective.size(), ranks - 1, ranks, timeout, seed, failed, worstKill,
      worstStop);
  std::printf("%s", summary.c_str());
  if (!out.empty()) {
    std::ofstream f(out);
    f << "# Fault-injection stress\n\nWritten by `build/tests/shoal_fault_stress --runs " << runs
      << " --seed " << seed << " --out " << out << "`.\n\n"
      << "Each injection starts " << ranks
      << " ranks looping one collective, then SIGKILLs or SIGSTOPs one random rank (rank 0 "
         "included) 0-20 ms after all are in the loop; it passes if every survivor exits with "
         "an error whose cause (`(cause: rank k)` and `Error::origin()`) is the victim, within "
         "the timeout + 1 s after a stop and 1 s + timeout after a kill.\n\n"
      << summary << "\n"
      << (failures.empty() ? std::string("No failures.\n") : "Failures:\n" + failures);
  }
  return failed == 0 ? 0 : 1;
}
