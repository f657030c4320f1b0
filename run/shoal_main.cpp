// The `shoal` command. Today: `shoal run`, the launcher (run/launcher.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "run/launcher.h"

using namespace shoal;

int main(int argc, char** argv) {
  CLI::App app{"Shoal: distributed training"};
  app.require_subcommand(1);
  auto* run =
      app.add_subcommand("run", "start a job's ranks: shoal run -n N [options] -- prog args");
  run::LaunchOptions o;
  std::string hosts, hostfile;
  std::vector<std::string> vars;
  double timeout = 0, timeLimit = 0;
  run->add_option("-n,--ranks", o.ranks, "number of ranks (with hosts: default one per slot)")
      ->check(CLI::Range(1, 1 << 20));
  run->add_option("--servers", o.servers,
                  "also start this many parameter-server processes (after the -n workers)")
      ->check(CLI::Range(0, 1 << 16));
  run->add_option("--hosts", hosts, "host1:slots,host2:slots (ranks fill hosts in order)");
  run->add_option("--hostfile", hostfile, "one host per line: host, host:slots or host slots=N");
  run->add_option("--timeout", timeout,
                  "seconds any blocking operation of a rank may wait (SHOAL_TIMEOUT; default 60)")
      ->check(CLI::PositiveNumber);
  run->add_option("--time-limit", timeLimit, "stop the whole job after this many seconds")
      ->check(CLI::PositiveNumber);
  run->add_option("--output-dir", o.outputDir, "also keep each rank's output in DIR/rank<r>.log");
  run->add_option("--port", o.port, "the store's port (default: a free one)")
      ->check(CLI::Range(1, 65535));
  run->add_option("--store-addr", o.storeAddress,
                  "address other hosts reach this machine at (default: the route to them)");
  run->add_option("--grace", o.graceSeconds, "seconds between SIGTERM and SIGKILL when stopping")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--ssh", o.sshCommand, "command that runs a shell command on a host");
  run->add_option("-x,--env", vars, "NAME=VALUE, or NAME to pass this variable on (repeatable)");
  run->add_flag(
      "-q,--quiet", [&](int64_t) { o.verbose = false; }, "no progress lines");
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
  try {
    app.parse(ours, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other configuration error.
    fmt::print(stderr, "shoal run: error: {}\n", e.what());
    return 2;
  }

  try {
    if (!hosts.empty() && !hostfile.empty()) {
      SHOAL_THROW(InvalidArgument, "give --hosts or --hostfile, not both");
    }
    if (!hosts.empty()) o.hosts = run::parseHostList(hosts);
    if (!hostfile.empty()) o.hosts = run::readHostfile(hostfile);
    if (o.hosts.empty() && o.ranks == 0) SHOAL_THROW(InvalidArgument, "-n is required");
    if (timeout > 0) o.opTimeoutSeconds = timeout;
    if (timeLimit > 0) o.timeLimitSeconds = timeLimit;
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
    o.command = run->remaining();
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
