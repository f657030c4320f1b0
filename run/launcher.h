// `shoal run`: starts a job's ranks on this machine and on ssh hosts, forwards their output,
// and stops the whole job when one rank fails or the user interrupts it.
//
// What it guarantees:
// - configuration errors (no ranks, unknown host, unreadable hostfile, program not found here or
//   on a host, a busy --port) are found before any rank starts: InvalidArgument, one line;
// - every rank gets the variables of run/rendezvous.h (and torchrun's names), the job secret
//   only through its environment (local) or ssh's stdin (remote), never on a command line;
// - each rank is started by run/spawner.h: its own process group, dies with the launcher
//   (PR_SET_PDEATHSIG), so a rank's children are stopped with it and nothing outlives the job;
// - when a rank exits non-zero or is killed, the others get SIGTERM (and SIGCONT, for stopped
//   ones) at once and SIGKILL after the grace period; SIGINT / SIGTERM / SIGHUP to the launcher
//   do the same for every rank;
// - the summary names the cause: the first rank that failed, or a local rank that was stopped
//   (SIGSTOP, SIGTSTP) before that and never continued, since its peers then fail only by
//   timing out. A stopped rank on another host cannot be seen (the launcher's child there is
//   ssh): the first rank to time out is named, and its own report names the silent rank.
//
// Single-threaded (besides the store's server thread); call launch() once per process.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/encryption.h"
#include "run/hosts.h"

namespace shoal::run {

struct LaunchOptions {
  int ranks = 0;  // workers; 0 with hosts: one per slot (less the servers)
  // Parameter-server processes, started after the workers: world ranks ranks..ranks+servers-1.
  int servers = 0;
  // Copies of each parameter-server shard (SHOAL_PS_REPLICAS for the ranks): with 2, a server
  // rank that fails does not stop the job (the workers go on with its shard's backup); the job
  // succeeds when every worker exited 0.
  int psReplicas = 1;
  // With psReplicas 2: a parameter server that fails is started again in its place, up to this
  // many times over the job, with SHOAL_PS_REPLACEMENT; the replacement takes its two shard
  // copies back from their surviving copies at a step boundary (Note [Replacement servers] in
  // ps/replacement.h; synchronous mode). 0: a lost server stays lost.
  int psReplacements = 0;
  std::vector<HostSlots> hosts;
  // `shoal run`'s own arguments as given, for the run record's configuration
  // (run/run_configuration.h: secret values redacted there); nothing reads them otherwise.
  std::vector<std::string> arguments;
  std::vector<std::string> command;                      // program, then its arguments
  std::vector<std::pair<std::string, std::string>> env;  // set for every rank (-x)
  std::optional<double> opTimeoutSeconds;                // SHOAL_TIMEOUT for the ranks
  std::optional<double> timeLimitSeconds;                // the whole job's wall time
  std::string outputDir;                                 // one log file per rank: <dir>/rank<r>.log
  int port = 0;                                          // the store's port; 0 picks a free one
  std::string storeAddress;  // the address ranks on other hosts reach the store at
  double graceSeconds = 5;   // SIGTERM, then SIGKILL after this long
  std::string sshCommand = "ssh -o BatchMode=yes";
  bool verbose = true;  // "shoal run: ..." progress lines on stderr
  // SHOAL_ENCRYPT for the store the launcher hosts (the ranks read their own): the same value
  // the ranks get, so the two ends of each store connection agree (common/encryption.h).
  EncryptMode encrypt = EncryptMode::kAuto;
  // Elastic jobs ("MIN:MAX", SHOAL_ELASTIC for the ranks; comm/membership.h): a worker that
  // fails does not stop the others, and is started again (as a new member that joins the
  // running job) up to `maxRestarts` times over the whole job.
  // Other jobs: when the job fails (not when interrupted or out of time), every rank is
  // started again, up to `maxRestarts` times, with SHOAL_RESTART_COUNT (and torchrun's
  // TORCHELASTIC_RESTART_COUNT) = the attempt, so the program resumes from its last
  // checkpoint (torchrun's model; the way a pipeline or ZeRO job survives a lost rank).
  // etcd(s)://host:port[/namespace]: the ranks' store is that etcd (store/etcd_store.h), not one
  // the launcher hosts, so the job's rendezvous survives this launcher's host.
  std::string storeUrl;
  std::optional<std::string> elastic;
  int maxRestarts = 0;
  // Elastic jobs: a program that prints the hosts the job may use now (run/host_discovery.h).
  // Run before the start (its hosts replace `hosts`) and then every `discoveryIntervalSeconds`
  // after a run ends: a new host or slot gets a new worker that joins (up to MAX), a host or slot
  // no longer listed has its worker stopped (SIGTERM, then SIGKILL after the grace period) and
  // the others go on without it.
  std::string hostDiscoveryScript;
  double discoveryIntervalSeconds = 1;
  // Elastic jobs: write the job's join file here once the store is up (run/join_file.h: owner
  // only, it holds the secret), removed when the job ends; `shoal join FILE -- prog` then starts
  // a worker by hand that joins the running job. With storeAddress, the store listens on every
  // interface, so that workers may join from other hosts.
  std::string joinFile;
  // The job's timeline (README "Timeline"): every rank gets SHOAL_TRACE=<tracePath>.ranks (made
  // absolute, created, emptied of old rank files before each attempt), and when the job ends,
  // failed or not, the rank files there are merged into `tracePath` (run/trace_merge.h) and a
  // summary line is printed. Ranks on other hosts write on their own host: the folder must be
  // on a shared filesystem for them to be merged (else they are listed as missing).
  std::string tracePath;
  int traceEvents = 0;  // SHOAL_TRACE_EVENTS for the ranks; 0: their default
  // The ranks' flight recorders (README "Flight recorder", run/job_flight.h): SHOAL_FLIGHT_DIR
  // for every rank. Empty: a temporary folder when every rank runs on this host (removed when
  // the job succeeds), else none. When an attempt fails, who was where is printed and the
  // folder kept.
  std::string flightDir;
  int flightEvents = -1;  // SHOAL_FLIGHT_EVENTS; -1: the ranks' default; 0: no recorder
  // The job's run directory (run/run_directory.h): run.json, the ranks' metrics.db (they get
  // SHOAL_RUN_DIR) and, unless flightDir says otherwise, the flight recorders in flight/. Must
  // not hold a run already. Empty: none.
  std::string runDir;
};

// Elastic jobs (options.elastic): a failed worker is reported and restarted while restarts are
// left (on its own slot, or on a free one if host discovery took its slot away); a slot whose
// worker failed is refilled only by such a restart, never by growth, so a host that crashes its
// workers cannot loop. New workers stop being started once a worker has finished (exited 0).
// The job succeeds when at least MIN workers exited 0, else it returns the first failed
// worker's exit code. Workers of an elastic job get SHOAL_WORLD_SIZE = the number started at
// launch (membership's first view) and SHOAL_RANK = their launch slot, which for a worker
// started later is that number or more (its rank in the job comes from the view it joins).
//
// Runs the job to the end (with maxRestarts, the last attempt). Returns 0 when every rank
// exited 0; else the first failed rank's exit
// code (128 + signal when killed; 128 + the stop signal when a stopped rank is blamed, e.g. 147
// for SIGSTOP), 124 when the time limit ended it, 128 + signal when the launcher was
// interrupted. Throws InvalidArgument for a configuration error (nothing started).
int launch(const LaunchOptions& options);

}  // namespace shoal::run
