#include "run/sweep/sweep_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <deque>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "common/wall_clock.h"
#include "run/process_util.h"
#include "run/slot_pool.h"
#include "run/sweep/asha.h"
#include "run/sweep/search_algorithm.h"
#include "run/sweep/trial_process.h"
#include "run/sweep/trial_slots.h"

namespace shoal::run::sweep {
namespace {

namespace fs = std::filesystem;
using std::chrono::duration;

// A trial under way.
struct Running {
  int id = 0;
  Assignment params;
  std::unique_ptr<TrialProcess> process;
  std::unique_ptr<MetricsReader> metrics;
  SteadyClock::time_point started;
  int64_t startedMs = 0;
  std::optional<SteadyClock::time_point> deadline;  // the trial's time limit
  std::optional<TrialStatus> stopAs;                // why we stopped it (pruned, timeout)
  std::string stopReason;
  TrialAllocation slots;  // with --hosts: what it holds until it ends
};

SteadyClock::duration seconds(double s) {
  return std::chrono::duration_cast<SteadyClock::duration>(duration<double>(s));
}

int64_t unixMs() {
  return wallClockNs() / 1'000'000;
}

std::string describeParams(const SweepConfig& c, const Assignment& a) {
  std::string s;
  for (size_t i = 0; i < a.size(); ++i) {
    s += fmt::format("{}{}={}", s.empty() ? "" : " ", c.parameters[i].name,
                     displayParameter(c.parameters[i], a[i]));
  }
  return s;
}

// A trial's `shoal run` flags for its slots: --hosts naming exactly them, --ssh, and -x for the
// configuration's env (remote ranks get only SHOAL_* and -x variables from the launcher) and
// SHOAL_SWEEP_SLOTS.
std::vector<std::string> hostArguments(const SweepConfig& c, const std::string& ssh,
                                       const TrialAllocation& slots) {
  std::vector<std::string> args = {"--hosts", slots.hostList()};
  if (!ssh.empty()) args.insert(args.end(), {"--ssh", ssh});
  for (const auto& [name, value] : c.env) args.insert(args.end(), {"-x", name + "=" + value});
  args.insert(args.end(), {"-x", "SHOAL_SWEEP_SLOTS=" + slots.slotList()});
  return args;
}

Observation observe(const TrialRecord& r) {
  if (r.status == TrialStatus::kFailed || r.curve.empty() || std::isnan(r.metric)) {
    return Observation{r.params, NAN, 0, false, true};
  }
  return Observation{r.params, r.metric, r.curve.back().epoch, r.status == TrialStatus::kCompleted,
                     false};
}

// Opens the directory's state: takes DIR/sweep.lock (two sweeps appending to one journal would
// each rerun the other's trials as interrupted), checks DIR/sweep.json against this sweep, writes
// it when new. The returned descriptor holds the lock until the sweep ends (or dies: the kernel
// drops it with the process).
Fd prepareDirectory(const SweepOptions& o) {
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) throwSystemError("sweep directory " + o.dir, ec.value());
  const std::string lockPath = o.dir + "/sweep.lock";
  Fd lock(::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) throwSystemError("sweep lock " + lockPath, errno);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      SHOAL_THROW(InvalidArgument, "--dir {}: another shoal sweep is running there", o.dir);
    }
    throwSystemError("sweep lock " + lockPath, errno);
  }
  const auto existing = readSweepRecord(o.dir);
  if (existing && !sameSweep(*existing, o.record) && !o.force) {
    SHOAL_THROW(InvalidArgument,
                "--dir {} holds another sweep (its sweep.json: another configuration, algorithm "
                "or seed): resume it with `shoal sweep --resume --dir {}`, use another --dir, or "
                "--force to run this configuration there",
                o.dir, o.dir);
  }
  // Rewritten when the limit the command line set changed, so a later resume keeps the new one.
  if (!existing || o.force || existing->trialTimeLimit != o.record.trialTimeLimit) {
    writeSweepRecord(o.dir, o.record);
  }
  return lock;
}

}  // namespace

std::string trialDirectory(const std::string& dir, int trial) {
  return fmt::format("{}/trial-{:04}", dir, trial);
}

SweepResult runSweep(const SweepOptions& o) {
  const SweepConfig& c = o.config;
  const auto sweepStart = SteadyClock::now();
  // Checked before the directory is touched: a sweep that could never start a trial is refused.
  std::optional<TrialSlots> pool;
  if (!o.hosts.empty()) {
    if (!c.viaLauncher) {
      SHOAL_THROW(InvalidArgument,
                  "--hosts needs trials started through `shoal run` (\"launcher\": \"shoal\"), "
                  "not \"direct\"");
    }
    pool.emplace(o.hosts);
    pool->checkFits(c.ranksPerTrial);
  }
  std::optional<SteadyClock::time_point> sweepDeadline;
  if (c.timeLimit) sweepDeadline = sweepStart + seconds(*c.timeLimit);
  const Fd lock = prepareDirectory(o);

  const std::string journalPath = o.dir + "/trials.jsonl";
  JournalContents past = readJournal(journalPath, c);
  SweepJournal journal(journalPath);
  SweepResult result;
  result.resumedTrials = static_cast<int>(past.finished.size());
  result.skippedJournalLines = past.skippedLines;

  std::unique_ptr<SearchAlgorithm> algorithm = makeSearchAlgorithm(c);
  std::optional<Asha> asha;
  if (c.earlyStopping.enabled) asha.emplace(c.earlyStopping, c.direction);
  std::vector<Observation> history;
  std::vector<TrialRecord> finished;
  int nextId = 0;
  for (const TrialRecord& r : past.finished) {
    history.push_back(observe(r));
    // ASHA's rungs as they were (in finishing order, near enough to the order of reports).
    if (asha) {
      for (const EpochValue& e : r.curve) asha->report(e.epoch, e.value);
    }
    nextId = std::max(nextId, r.id + 1);
    finished.push_back(r);
  }
  std::deque<std::pair<int, Assignment>> reruns(past.interrupted.begin(), past.interrupted.end());
  for (const auto& [id, params] : past.interrupted) nextId = std::max(nextId, id + 1);
  if (o.progress != nullptr && (!finished.empty() || !reruns.empty())) {
    fmt::print(o.progress, "shoal sweep: resuming {}: {} trials finished, {} to run again\n", o.dir,
               finished.size(), reruns.size());
  }

  if (o.progress != nullptr) {
    const bool tpe = c.algorithm == Algorithm::kTpe;
    fmt::print(o.progress, "shoal sweep: {}{}, {} trials, {} at once, {}\n", toString(c.algorithm),
               tpe && c.tpe.multivariate ? " (multivariate)" : "", c.trials, c.parallel,
               c.trialTimeLimit ? fmt::format("each stopped after {} s", *c.trialTimeLimit)
                                : std::string("no limit per trial"));
    if (pool) {
      const int fit = pool->total() / c.ranksPerTrial;
      fmt::print(o.progress, "shoal sweep: {} ranks per trial on {} slots ({}){}\n",
                 c.ranksPerTrial, pool->total(), SlotPool::describe(pool->hosts()),
                 fit < c.parallel ? fmt::format(": at most {} trials at once, the others wait "
                                                "for slots",
                                                fit)
                                  : "");
    }
  }

  std::vector<std::string> env = o.env;
  for (const auto& [name, value] : c.env) env.push_back(name + "=" + value);

  // Through the launcher, `shoal run` gets the grace to stop its ranks itself (--grace) and a
  // second more before it is killed; its ranks die with it either way (PR_SET_PDEATHSIG).
  const double killAfter = c.graceSeconds + (c.viaLauncher ? 1.0 : 0.0);
  std::vector<Running> running;
  bool exhausted = false, stopping = false;
  auto progress = [&](const std::string& line) {
    if (o.progress == nullptr) return;
    fmt::print(o.progress, "{}\n", line);
    std::fflush(o.progress);
  };

  auto record = [&](TrialRecord r) {
    journal.finished(c, r);
    history.push_back(observe(r));
    progress(fmt::format("[{}/{}] trial {} {}{} in {:.1f} s{}: {}{}", finished.size() + 1, c.trials,
                         r.id, toString(r.status),
                         std::isnan(r.metric) ? "" : fmt::format(" {}={:.6g}", c.metric, r.metric),
                         r.seconds, r.hosts.empty() ? "" : " on " + r.hosts,
                         describeParams(c, r.params),
                         r.reason.empty() ? "" : " (" + r.reason + ")"));
    finished.push_back(std::move(r));
  };

  // With hosts, `slots` is what the trial holds (given back when it ends).
  auto launch = [&](int id, const Assignment& params, TrialAllocation slots) {
    const std::string trialDir = trialDirectory(o.dir, id);
    std::error_code ec;
    fs::create_directories(trialDir, ec);
    if (ec) throwSystemError("trial directory " + trialDir, ec.value());
    const std::string metricsFile = fs::absolute(trialDir + "/metrics.jsonl").string();
    fs::remove(metricsFile, ec);  // a rerun starts from no epochs
    std::vector<std::string> argv =
        trialCommand(c, params, id, fs::absolute(trialDir).string(), metricsFile);
    if (c.viaLauncher) {
      std::vector<std::string> launcher;
      if (pool) launcher = hostArguments(c, o.sshCommand, slots);
      launcher.push_back("--");
      argv.insert(argv.begin(), launcher.begin(), launcher.end());
      // The flight recorders into the trial's folder: a stopped trial is a "failed" job to the
      // launcher, which would otherwise keep them in a new /tmp folder per stopped trial.
      argv.insert(argv.begin(), {o.shoalProgram, "run", "-n", std::to_string(c.ranksPerTrial), "-q",
                                 "--grace", fmt::format("{}", c.graceSeconds), "--flight-dir",
                                 fs::absolute(trialDir + "/flight").string()});
    }
    const std::string hosts = pool ? slots.hostList() : "";
    const std::string slotList = pool ? slots.slotList() : "";
    journal.started(c, id, params, hosts, slotList);
    Running r;
    r.id = id;
    r.params = params;
    r.started = SteadyClock::now();
    r.startedMs = unixMs();
    if (c.trialTimeLimit) r.deadline = r.started + seconds(*c.trialTimeLimit);
    r.metrics = std::make_unique<MetricsReader>(metricsFile, c.metric);
    r.slots = std::move(slots);
    try {
      r.process = std::make_unique<TrialProcess>(argv, env, trialDir + "/log.txt");
    } catch (const Error& e) {
      TrialRecord failed;
      failed.id = id;
      failed.params = params;
      failed.status = TrialStatus::kFailed;
      failed.metric = NAN;
      failed.reason = fmt::format("could not start: {}", e.what());
      failed.startedMs = failed.endedMs = r.startedMs;
      failed.hosts = hosts;
      failed.slots = slotList;
      record(std::move(failed));
      if (pool) pool->release(r.slots);
      return;
    }
    running.push_back(std::move(r));
  };

  auto finish = [&](Running& r, int status) {
    r.metrics->poll();
    TrialRecord t;
    t.id = r.id;
    t.params = r.params;
    t.curve = r.metrics->curve();
    t.metric = t.curve.empty() ? NAN : t.curve.back().value;
    t.seconds = duration<double>(SteadyClock::now() - r.started).count();
    t.exitCode = exitCodeOf(status);
    t.startedMs = r.startedMs;
    t.endedMs = unixMs();
    if (pool) {
      t.hosts = r.slots.hostList();
      t.slots = r.slots.slotList();
    }
    const bool exitedZero = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // A trial that reported its last epoch and exited 0 finished before the stop reached it
    // (ASHA read a rung after the fact): it completed.
    const bool ranToTheEnd = c.earlyStopping.enabled && !t.curve.empty() &&
                             t.curve.back().epoch >= c.earlyStopping.maxEpochs;
    if (r.stopAs && !(exitedZero && ranToTheEnd && !std::isnan(t.metric))) {
      t.status = *r.stopAs;
      t.reason = r.stopReason;
    } else if (exitedZero && !std::isnan(t.metric)) {
      t.status = TrialStatus::kCompleted;
    } else {
      t.status = TrialStatus::kFailed;
      t.reason = exitedZero ? fmt::format("no '{}' in its metrics file", c.metric)
                            : describeStatus(status);
    }
    record(std::move(t));
  };

  auto stopTrial = [&](Running& r, TrialStatus as, std::string why) {
    if (r.process->terminating()) return;
    r.stopAs = as;
    r.stopReason = std::move(why);
    r.process->terminate(killAfter);
  };

  while (true) {
    // Start trials while there is room, budget and time.
    // With hosts, also while ranks_per_trial slots are free: the others wait for a release.
    while (!stopping && !exhausted && static_cast<int>(running.size()) < c.parallel &&
           static_cast<int>(finished.size() + running.size()) < c.trials &&
           (!pool || pool->free() >= c.ranksPerTrial)) {
      TrialAllocation slots;
      if (pool) slots = *pool->take(c.ranksPerTrial);
      if (!reruns.empty()) {
        auto [id, params] = std::move(reruns.front());
        reruns.pop_front();
        launch(id, params, std::move(slots));
        continue;
      }
      const int id = nextId;
      std::optional<Assignment> params = algorithm->suggest(id, history);
      if (!params) {
        if (pool) pool->release(slots);
        exhausted = true;
        break;
      }
      ++nextId;
      launch(id, *params, std::move(slots));
    }
    if (running.empty()) break;

    auto now = SteadyClock::now();
    auto wakeAt = now + seconds(o.pollSeconds);
    if (sweepDeadline && !stopping) wakeAt = std::min(wakeAt, *sweepDeadline);
    for (const Running& r : running) {
      if (r.deadline && !r.process->terminating()) wakeAt = std::min(wakeAt, *r.deadline);
      if (auto k = r.process->killDeadline()) wakeAt = std::min(wakeAt, *k);
    }
    std::vector<pollfd> fds;
    for (const Running& r : running) fds.push_back({r.process->pollFd(), POLLIN, 0});
    if (o.stopFd >= 0 && !stopping) fds.push_back({o.stopFd, POLLIN, 0});
    const auto waitMs = std::chrono::ceil<std::chrono::milliseconds>(wakeAt - now).count();
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, waitMs)));
    if (n < 0 && errno != EINTR) throwSystemError("shoal sweep: poll", errno);
    now = SteadyClock::now();

    if (o.stopFd >= 0 && !stopping && n > 0 && (fds.back().revents & (POLLIN | POLLHUP)) != 0) {
      stopping = true;
      result.interrupted = true;
      progress(fmt::format("shoal sweep: stopping; {} running trials are left for --resume",
                           running.size()));
      for (Running& r : running) r.process->terminate(killAfter);
    }
    if (sweepDeadline && now >= *sweepDeadline && !stopping) {
      stopping = true;
      result.timedOut = true;
      for (Running& r : running) {
        stopTrial(r, TrialStatus::kTimedOut,
                  fmt::format("the sweep's time limit ({} s)", *c.timeLimit));
      }
    }
    for (Running& r : running) {
      if (r.process->terminating()) {
        r.process->escalate(now);
        continue;
      }
      if (r.deadline && now >= *r.deadline) {
        stopTrial(r, TrialStatus::kTimedOut,
                  fmt::format("the trial time limit ({} s)", *c.trialTimeLimit));
        continue;
      }
      for (const EpochValue& e : r.metrics->poll()) {
        if (asha && asha->report(e.epoch, e.value)) {
          stopTrial(r, TrialStatus::kPruned, fmt::format("ASHA at epoch {}", e.epoch));
          break;
        }
      }
    }
    // Reap what has exited (the pidfds that polled readable, or any: reap() never blocks).
    for (size_t i = 0; i < running.size();) {
      const std::optional<int> status = running[i].process->reap();
      if (!status) {
        ++i;
        continue;
      }
      if (!result.interrupted) finish(running[i], *status);
      // Given back whatever the outcome (finished, failed, stopped, interrupted).
      if (pool) pool->release(running[i].slots);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  std::sort(finished.begin(), finished.end(),
            [](const TrialRecord& a, const TrialRecord& b) { return a.id < b.id; });
  result.trials = std::move(finished);
  for (size_t i = 0; i < result.trials.size(); ++i) {
    const TrialRecord& t = result.trials[i];
    if (t.status != TrialStatus::kCompleted) continue;
    if (!result.best || isBetter(c.direction, t.metric, result.trials[*result.best].metric)) {
      result.best = i;
    }
  }
  result.seconds = duration<double>(SteadyClock::now() - sweepStart).count();
  return result;
}

}  // namespace shoal::run::sweep
