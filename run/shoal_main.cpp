// The `shoal` command: `shoal run`, the launcher (run/launcher.h), `shoal join FILE -- prog`, a
// worker started by hand joining a running elastic job (run/join_file.h), `shoal flight DIR`, who
// was where in a job's flight recorders (run/flight_report.h), `shoal ui [RUNS_DIR]`, the
// dashboard over the runs' metrics (tools/ui_server.h), `shoal report RUN_DIR`, a static
// report of one run (tools/report.h), `shoal tensorboard RUN_DIR`, its metrics as TensorBoard
// event files (tools/tensorboard_export.h), and `shoal sweep CONFIG.json --dir DIR`, a
// hyperparameter search over a training program (tools/sweep_command.h); `shoal serve MODEL`
// runs the inference server, shoal-serve (tools/serve/).
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "run/flight_report.h"
#include "run/join_file.h"
#include "run/launcher.h"
#include "store/etcd_store.h"
#include "tools/report.h"
#include "tools/sweep_command.h"
#include "tools/tensorboard_export.h"
#include "tools/ui_server.h"

using namespace shoal;

namespace {

// Serves until SIGINT or SIGTERM. The signals are blocked before the server's threads start
// (they inherit the mask), so sigwait() here is the only place they are taken.
int serveUi(tools::UiOptions options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  tools::UiServer server(options);
  server.start();
  fmt::print("shoal ui: serving {} at {}\n", options.runsDir, server.url());
  std::fflush(stdout);
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  server.stop();
  return 0;
}

// `shoal serve ARGS...` runs `shoal-serve ARGS...` in its place (exec: its output, signals and
// exit code are the server's). The inference server is a program of its own because it needs
// libtorch and `shoal` does not: the one beside this program, else the first on PATH.
int forwardToServe(int argc, char** argv) {
  std::vector<std::string> args{"shoal-serve"};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> argvOut;
  for (auto& a : args) argvOut.push_back(a.data());
  argvOut.push_back(nullptr);
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string beside;
  if (len > 0) {
    self[len] = '\0';
    beside = (std::filesystem::path(self).parent_path() / "shoal-serve").string();
    if (::access(beside.c_str(), X_OK) == 0) ::execv(beside.c_str(), argvOut.data());
  }
  ::execvp("shoal-serve", argvOut.data());
  fmt::print(stderr,
             "shoal serve: cannot start shoal-serve ({}): it is neither beside this program{} "
             "nor on PATH; it is built with libtorch (SHOAL_WITH_TORCH=ON)\n",
             std::strerror(errno), beside.empty() ? "" : " (" + beside + ")");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Before the parser: every argument after `serve` is shoal-serve's, its --help included.
  if (argc >= 2 && std::string_view(argv[1]) == "serve") return forwardToServe(argc, argv);
  CLI::App app{"Shoal: distributed training"};
  app.require_subcommand(1);
  auto* run =
      app.add_subcommand("run", "start a job's ranks: shoal run -n N [options] -- prog args");
  run::LaunchOptions o;
  std::string hosts, hostfile;
  std::vector<std::string> vars;
  // Numbers are taken as text and read by the one configuration parser (common/env.h): the same
  // checks and the same one-line errors as the SHOAL_* variables (no "inf", no "5x").
  std::string ranks, servers, psReplicas, psReplacements, timeout, timeLimit, port, grace;
  run->add_option("-n,--ranks", ranks, "number of ranks (with hosts: default one per slot)");
  run->add_option("--servers", servers,
                  "also start this many parameter-server processes (after the -n workers)");
  run->add_option("--ps-replicas", psReplicas,
                  "copies of each parameter-server shard, 1 or 2: with 2 the job survives a lost "
                  "server (default 1)");
  run->add_option("--ps-replacements", psReplacements,
                  "with --ps-replicas 2: start a lost parameter server again, up to this many "
                  "times, as a replacement that takes its shards back from their surviving "
                  "copies (synchronous mode; default 0)");
  run->add_option("--hosts", hosts, "host1:slots,host2:slots (ranks fill hosts in order)");
  run->add_option("--hostfile", hostfile, "one host per line: host, host:slots or host slots=N");
  run->add_option("--timeout", timeout,
                  "seconds any blocking operation of a rank may wait (SHOAL_TIMEOUT; default 60)");
  run->add_option("--time-limit", timeLimit, "stop the whole job after this many seconds");
  run->add_option("--output-dir", o.outputDir, "also keep each rank's output in DIR/rank<r>.log");
  run->add_option("--port", port, "the store's port (default, or 0: a free one, announced)");
  run->add_option("--store-addr", o.storeAddress,
                  "address other hosts reach this machine at (default: the route to them)");
  run->add_option("--grace", grace,
                  "seconds between SIGTERM and SIGKILL when stopping (default 5)");
  run->add_option("--ssh", o.sshCommand, "command that runs a shell command on a host");
  run->add_option("--store", o.storeUrl,
                  "etcd://host:port[/namespace] (etcds:// for TLS): the ranks' store (default: "
                  "SHOAL_STORE_ADDR when it names etcd, else one this launcher hosts)");
  std::string elastic;
  run->add_option("--elastic", elastic,
                  "MIN:MAX: survivors of a failed worker go on, new workers join (elastic job)");
  run->add_option("--max-restarts", o.maxRestarts,
                  "restart failed workers (--elastic), else the whole failed job (ranks resume "
                  "from their checkpoints), this many times in all (default 0)");
  run->add_option("--host-discovery-script", o.hostDiscoveryScript,
                  "with --elastic: a program printing the hosts to use now (hostfile lines); run "
                  "at start and then every --discovery-interval: workers join new slots (up to "
                  "MAX) and leave slots no longer listed");
  std::string discoveryInterval, traceEvents;
  run->add_option("--trace", o.tracePath,
                  "write the job's timeline (every rank's operations, clocks aligned) to FILE, "
                  "Chrome trace / Perfetto JSON");
  run->add_option("--trace-events", traceEvents,
                  "spans each rank keeps for --trace (SHOAL_TRACE_EVENTS; default 100000)");
  std::string flightEvents;
  run->add_option("--run-dir", o.runDir,
                  "keep the job's run directory in DIR (a new folder): run.json, the ranks' "
                  "metrics.db (SHOAL_RUN_DIR), the flight recorders");
  run->add_option("--flight-dir", o.flightDir,
                  "keep every rank's flight recorder (its last operations) in DIR (default: a "
                  "temporary folder, kept only when the job fails)");
  run->add_option("--flight-events", flightEvents,
                  "operations each rank's flight recorder keeps (SHOAL_FLIGHT_EVENTS; default "
                  "4096; 0: none)");
  run->add_option("--discovery-interval", discoveryInterval,
                  "seconds between runs of the host discovery program (default 1)");
  run->add_option("--join-file", o.joinFile,
                  "with --elastic: write FILE (owner-only: it holds the job's secret) while the "
                  "job runs; `shoal join FILE -- prog` starts a worker by hand that joins it");
  run->add_option("-x,--env", vars, "NAME=VALUE, or NAME to pass this variable on (repeatable)");
  run->add_flag(
      "-q,--quiet", [&](int64_t) { o.verbose = false; }, "no progress lines");
  auto* join = app.add_subcommand(
      "join", "start a worker by hand that joins a running elastic job: shoal join FILE -- prog");
  std::string joinFile;
  join->add_option("FILE", joinFile, "the job's join file (shoal run --join-file)")->required();
  auto* flight = app.add_subcommand(
      "flight", "who was where: the first desynchronised operation in a job's flight recorders");
  std::string flightDir, flightRanks;
  flight->add_option("DIR", flightDir, "the folder of flight.rank<R> files")->required();
  flight->add_option("-n,--ranks", flightRanks, "the job's ranks: those without a file are named");
  auto* ui = app.add_subcommand(
      "ui",
      "a local web dashboard over the runs in RUNS_DIR: their metrics, live (README Dashboard)");
  tools::UiOptions uiOptions;
  std::string uiPort;
  ui->add_option("RUNS_DIR", uiOptions.runsDir, "the folder of run directories (default: runs)");
  ui->add_option("--host", uiOptions.host,
                 "the address to listen on (default 127.0.0.1; any other needs --token)");
  ui->add_option("--port", uiPort, "the port (default 0: a free one, announced)");
  ui->add_option("--token", uiOptions.token,
                 "require this token of every request (?token= or Authorization: Bearer)");
  auto* report = app.add_subcommand(
      "report", "a static report of one run: RUN_DIR/report/report.html and a PNG per metric");
  std::string reportRun, reportOut;
  report->add_option("RUN_DIR", reportRun, "the run directory (holding run.json)")->required();
  report->add_option("-o,--out", reportOut, "the report's folder (default: RUN_DIR/report)");
  auto* tensorboard = app.add_subcommand(
      "tensorboard", "a run's metrics as TensorBoard event files: one run per rank, tag = metric");
  std::string tensorboardRun, tensorboardOut;
  tensorboard->add_option("RUN_DIR", tensorboardRun, "the run directory (holding run.json)")
      ->required();
  tensorboard->add_option("-o,--out", tensorboardOut,
                          "the folder for tensorboard --logdir (default: RUN_DIR/tensorboard)");

  // Listed for --help only: main() hands `shoal serve ...` to shoal-serve before parsing.
  app.add_subcommand("serve",
                     "an HTTP inference server with dynamic batching: shoal serve MODEL [options] "
                     "runs shoal-serve (README \"Export and serving\")")
      ->allow_extras();
  auto* sweep = app.add_subcommand(
      "sweep",
      "hyperparameter search: run a training program's trials over a search space "
      "(grid, random or TPE; ASHA early stopping); README \"Hyperparameter sweeps\"");
  tools::SweepCommandOptions sweepOptions;
  sweep->add_option("CONFIG", sweepOptions.configPath,
                    "the sweep's JSON configuration (not needed with --resume)");
  sweep->add_option("--dir", sweepOptions.dir,
                    "the sweep directory: journal, trials, results (required)");
  sweep->add_option("--parallel", sweepOptions.parallel, "trials at once (overrides the config)");
  sweep->add_option("--trials", sweepOptions.trials, "the trial budget (overrides the config)");
  sweep->add_option("--algorithm", sweepOptions.algorithm, "grid, random or tpe (overrides)");
  sweep->add_option("--seed", sweepOptions.seed, "the search's seed (overrides the config)");
  sweep->add_option("--trial-time-limit", sweepOptions.trialTimeLimit,
                    "seconds a trial may run before it is stopped as \"timeout\" (overrides "
                    "the config's trial_time_limit, default 3600; 0: no limit; kept for --resume)");
  sweep->add_option("--hosts", sweepOptions.hosts,
                    "run the trials on host1:slots,host2:slots (each trial takes ranks_per_trial "
                    "free slots; default: this machine)");
  sweep->add_option("--hostfile", sweepOptions.hostfile,
                    "the hosts, one per line: host, host:slots or host slots=N");
  sweep->add_option("--ssh", sweepOptions.ssh,
                    "with hosts: passed to each trial's shoal run --ssh (default: its own)");
  sweep->add_flag(
      "--resume", sweepOptions.resume,
      "continue the sweep in --dir, or `--resume DIR` (its own configuration unless CONFIG "
      "is given): "
      "finished trials are kept, interrupted ones rerun");
  sweep->add_flag("--force", sweepOptions.force,
                  "run CONFIG in a --dir holding another sweep (past trials that fit are kept)");
  run->prefix_command();  // without --, the first word that is not an option starts the program
  // Everything after the first -- is the program and its arguments, untouched.
  std::vector<std::string> command;
  int ours = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      ours = i;
      command.assign(argv + i + 1, argv + argc);
      break;
    }
  }
  // CLI11 would say "A subcommand is required" or "arguments were not expected" without naming
  // the word; say which word is not a command.
  const std::string command0 = argc >= 2 ? argv[1] : "";
  if (argc >= 2 && argv[1][0] != '-' && command0 != "run" && command0 != "flight" &&
      command0 != "ui" && command0 != "report" && command0 != "tensorboard" &&
      command0 != "sweep" && command0 != "join") {
    fmt::print(stderr,
               "shoal: error: unknown command '{}' (the commands: run, join, flight, ui, report, "
               "tensorboard, sweep; see shoal --help)\n",
               argv[1]);
    return 2;
  }
  try {
    app.parse(ours, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other configuration error.
    fmt::print(stderr, "shoal{}: error: {}\n", command0.empty() ? "" : " " + command0, e.what());
    return 2;
  }
  if (*ui) {
    try {
      if (!uiPort.empty())
        uiOptions.port = static_cast<int>(parseInteger("--port", uiPort, 0, 65535));
      return serveUi(uiOptions);
    } catch (const InvalidArgument& e) {
      fmt::print(stderr, "shoal ui: error: {}\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal ui: {}\n", e.what());
      return 1;
    }
  }
  if (*sweep) return tools::runSweepCommand(sweepOptions);
  if (*join) {
    try {
      run::execJoiner(joinFile, command);  // returns only by throwing
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal join: error: {}\n", e.what());
      return 2;
    }
  }
  if (*report) {
    try {
      const tools::ReportResult r = tools::writeReport(reportRun, reportOut);
      fmt::print("shoal report: {} -> {} ({} plots)\n", reportRun, r.htmlPath, r.plots);
      return 0;
    } catch (const InvalidArgument& e) {
      fmt::print(stderr, "shoal report: error: {}\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal report: {}\n", e.what());
      return 1;
    }
  }
  if (*tensorboard) {
    try {
      const tools::TensorBoardExport r = tools::exportTensorBoard(tensorboardRun, tensorboardOut);
      if (r.files.empty()) {
        fmt::print("shoal tensorboard: {}: no finite points ({} skipped); nothing written\n",
                   tensorboardRun, r.skipped);
        return 0;
      }
      fmt::print("shoal tensorboard: {} -> {} ({} ranks, {} points, {} skipped as not finite)\n",
                 tensorboardRun, r.outDir, r.files.size(), r.points, r.skipped);
      for (const tools::TensorBoardRankFile& f : r.files) {
        fmt::print("  rank {}: {} ({} points, {} tags)\n", f.rank, f.path, f.points, f.tags);
      }
      fmt::print("view with: tensorboard --logdir {}\n", r.outDir);
      return 0;
    } catch (const InvalidArgument& e) {
      fmt::print(stderr, "shoal tensorboard: error: {}\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal tensorboard: {}\n", e.what());
      return 1;
    }
  }
  if (*flight) {
    try {
      const int n = flightRanks.empty()
                        ? 0
                        : static_cast<int>(parseInteger("--ranks", flightRanks, 1, 1 << 20));
      fmt::print("{}", run::describe(run::diagnoseFlightDir(flightDir, n)));
      return 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "shoal flight: error: {}\n", e.what());
      return 2;
    }
  }

  try {
    if (!ranks.empty()) o.ranks = static_cast<int>(parseInteger("--ranks", ranks, 1, 1 << 20));
    if (!servers.empty()) {
      o.servers = static_cast<int>(parseInteger("--servers", servers, 0, 1 << 16));
    }
    if (!psReplicas.empty()) {
      o.psReplicas = static_cast<int>(parseInteger("--ps-replicas", psReplicas, 1, 2));
    }
    if (!psReplacements.empty()) {
      o.psReplacements =
          static_cast<int>(parseInteger("--ps-replacements", psReplacements, 0, 1 << 16));
    }
    if (!timeout.empty()) {
      o.opTimeoutSeconds =
          parseNumber("--timeout", timeout, kMinTimeoutSeconds, kMaxTimeoutSeconds);
    }
    if (!timeLimit.empty()) {
      o.timeLimitSeconds = parseNumber("--time-limit", timeLimit, 0.001, kMaxTimeoutSeconds);
    }
    if (!elastic.empty()) o.elastic = elastic;
    if (!traceEvents.empty()) {
      if (o.tracePath.empty()) SHOAL_THROW(InvalidArgument, "--trace-events needs --trace FILE");
      o.traceEvents = static_cast<int>(parseInteger("--trace-events", traceEvents, 1, 1 << 24));
    }
    if (!flightEvents.empty()) {
      o.flightEvents = static_cast<int>(
          parseInteger("--flight-events", flightEvents, 0, static_cast<int64_t>(kMaxFlightEvents)));
    }
    if (!discoveryInterval.empty()) {
      if (o.hostDiscoveryScript.empty()) {
        SHOAL_THROW(InvalidArgument, "--discovery-interval needs --host-discovery-script");
      }
      o.discoveryIntervalSeconds =
          parseNumber("--discovery-interval", discoveryInterval, 0.01, 3600);
    }
    if (o.storeUrl.empty()) {
      if (const char* url = std::getenv("SHOAL_STORE_ADDR");
          url != nullptr && store::EtcdAddress::matches(url)) {
        o.storeUrl = url;
      }
    }
    if (!port.empty()) o.port = static_cast<int>(parseInteger("--port", port, 0, 65535));
    if (!grace.empty()) o.graceSeconds = parseNumber("--grace", grace, 0, 3600);
    if (!hosts.empty() && !hostfile.empty()) {
      SHOAL_THROW(InvalidArgument, "give --hosts or --hostfile, not both");
    }
    if (!hosts.empty()) o.hosts = run::parseHostList(hosts);
    if (!hostfile.empty()) o.hosts = run::readHostfile(hostfile);
    if (o.hosts.empty() && o.ranks == 0 && o.hostDiscoveryScript.empty())
      SHOAL_THROW(InvalidArgument, "-n is required");
    for (auto& v : vars) {
      auto eq = v.find('=');
      if (eq != std::string::npos) {
        o.env.emplace_back(v.substr(0, eq), v.substr(eq + 1));
      } else if (const char* value = std::getenv(v.c_str())) {
        o.env.emplace_back(v, value);
      } else {
        SHOAL_THROW(InvalidArgument, "-x {}: not set in this environment", v);
      }
    }
    // The store's SHOAL_ENCRYPT: what the ranks will get (-x first, then this environment).
    o.encrypt = readEncryptMode([&](const std::string& name) -> std::optional<std::string> {
      for (auto it = o.env.rbegin(); it != o.env.rend(); ++it) {
        if (it->first == name) return it->second;
      }
      return processEnvReader()(name);
    });
    o.command = run->remaining();
    // Before `--` (or the program, without it): the launcher's own words.
    o.arguments.assign(argv + 2, argv + ours - static_cast<ptrdiff_t>(o.command.size()));
    o.command.insert(o.command.end(), command.begin(), command.end());
    return run::launch(o);
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "shoal run: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "shoal run: {}\n", e.what());
    return 1;
  }
}
