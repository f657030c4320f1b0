#include "tools/sweep_command.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/env.h"
#include "common/error.h"
#include "common/socket.h"
#include "run/hosts.h"
#include "run/process_util.h"
#include "run/sweep/sweep_results.h"
#include "run/sweep/sweep_runner.h"
#include "tools/sweep_plots.h"

namespace shoal::tools {
namespace {

namespace sw = run::sweep;

std::string selfProgram() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throwSystemError("readlink /proc/self/exe", errno);
  return std::string(path, static_cast<size_t>(n));
}

// The configuration and the record DIR/sweep.json should hold for this invocation.
std::pair<sw::SweepConfig, sw::SweepRecord> loadConfig(const SweepCommandOptions& o) {
  sw::SweepRecord record;
  const auto existing = sw::readSweepRecord(o.dir);
  if (o.resume && !existing) {
    SHOAL_THROW(InvalidArgument, "--resume: {} holds no sweep (no sweep.json)", o.dir);
  }
  sw::SweepConfig config;
  if (!o.configPath.empty()) {
    const std::string text = sw::readSweepConfigText(o.configPath);
    try {
      config = sw::parseSweepConfig(text);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "{}: {}", o.configPath, e.what());
    }
    // As given (it parsed above), kept in DIR/sweep.json.
    record.configJson = nlohmann::ordered_json::parse(text).dump();
    record.algorithm = config.algorithm;
    record.seed = config.seed;
  } else {
    if (!existing) {
      SHOAL_THROW(InvalidArgument, "give CONFIG.json (or --resume with a --dir holding a sweep)");
    }
    record = *existing;
    try {
      config = sw::parseSweepConfig(record.configJson);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "{}/sweep.json: {}", o.dir, e.what());
    }
    config.algorithm = record.algorithm;
    config.seed = record.seed;
  }
  if (!o.algorithm.empty()) config.algorithm = record.algorithm = sw::parseAlgorithm(o.algorithm);
  if (!o.seed.empty()) {
    config.seed = record.seed =
        static_cast<uint64_t>(parseInteger("--seed", o.seed, 0, int64_t{1} << 52));
  }
  if (!o.trials.empty())
    config.trials = static_cast<int>(parseInteger("--trials", o.trials, 1, 1'000'000));
  if (!o.parallel.empty()) {
    config.parallel = static_cast<int>(parseInteger("--parallel", o.parallel, 1, 1024));
  }
  if (!o.trialTimeLimit.empty()) {
    record.trialTimeLimit = parseNumber("--trial-time-limit", o.trialTimeLimit, 0, sw::kMaxSeconds);
  } else if (existing && existing->trialTimeLimit && !o.force && sw::sameSweep(*existing, record)) {
    record.trialTimeLimit = existing->trialTimeLimit;  // the same sweep again: keep its limit
  }
  if (record.trialTimeLimit) {
    config.trialTimeLimit =
        *record.trialTimeLimit == 0 ? std::nullopt : std::optional<double>(*record.trialTimeLimit);
  }
  return {config, record};
}

}  // namespace

int runSweepCommand(const SweepCommandOptions& given) {
  SweepCommandOptions o = given;
  // `shoal sweep --resume DIR`: the one word is the directory.
  std::error_code ec;
  if (o.resume && o.dir.empty() && std::filesystem::is_directory(o.configPath, ec)) {
    o.dir = std::exchange(o.configPath, "");
  }
  sw::SweepOptions options;
  try {
    if (o.dir.empty()) SHOAL_THROW(InvalidArgument, "--dir is required");
    auto [config, record] = loadConfig(o);
    options.config = std::move(config);
    options.record = std::move(record);
    if (!o.hosts.empty() && !o.hostfile.empty()) {
      SHOAL_THROW(InvalidArgument, "give --hosts or --hostfile, not both");
    }
    if (!o.hosts.empty()) options.hosts = run::parseHostList(o.hosts);
    if (!o.hostfile.empty()) options.hosts = run::readHostfile(o.hostfile);
    if (!options.hosts.empty()) {
      run::placeRanks(0, options.hosts);  // every host resolves, before anything starts
    } else if (!o.ssh.empty()) {
      SHOAL_THROW(InvalidArgument, "--ssh needs --hosts or --hostfile");
    }
    options.sshCommand = o.ssh;
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "shoal sweep: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal sweep: {}\n", e.what());
    return 1;
  }
  options.dir = o.dir;
  options.force = o.force;
  options.progress = stdout;
  options.env = run::environmentWithout({});

  // SIGINT/SIGTERM become a readable descriptor the sweep polls: it then stops its trials and
  // returns, and the journal keeps what finished. Trials are spawned with nothing blocked.
  sigset_t stopSignals, previous;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, &previous);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};
  Fd stop(::signalfd(-1, &stopSignals, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!stop.valid()) {
    fmt::print(stderr, "shoal sweep: signalfd: {}\n", std::strerror(errno));
    return 1;
  }
  options.stopFd = stop.get();

  sw::SweepResult result;
  try {
    options.shoalProgram = selfProgram();
    result = sw::runSweep(options);
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "shoal sweep: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal sweep: {}\n", e.what());
    return 1;
  }
  try {
    fmt::print("\n{}", sw::formatResultsTable(options.config, result, o.dir));
    sw::writeResultsCsv(o.dir + "/results.csv", options.config, result);
    sw::writeBestJson(o.dir + "/best.json", options.config, result, o.dir);
    const int plots = writeSweepPlots(o.dir, options.config, result);
    fmt::print("results: {0}/results.csv, {0}/best.json, {1} plots in {0}/plots ({2:.1f} s)\n",
               o.dir, plots, result.seconds);
    if (result.skippedJournalLines > 0) {
      fmt::print("note: {} unreadable lines of {}/trials.jsonl were skipped\n",
                 result.skippedJournalLines, o.dir);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal sweep: writing the results: {}\n", e.what());
    return 1;
  }
  if (result.interrupted) {
    fmt::print("shoal sweep: interrupted; `shoal sweep --resume {}` continues\n", o.dir);
    return 130;
  }
  if (result.timedOut) fmt::print("shoal sweep: the time limit stopped the sweep\n");
  return result.best ? 0 : 1;
}

}  // namespace shoal::tools
