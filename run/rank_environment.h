// The variables a rank of a `shoal run` job starts with (run/rendezvous.h says what each
// means, and torchrun's names are set too), what a worker started by hand needs to join an
// elastic job (run/join_file.h), and the script an ssh host runs for a remote rank.
//
// The job secret is never among a rank's variables: the launcher gives it to a local rank in its
// environment and to a remote one on ssh's stdin, never on a command line. Pure but for
// remoteRankCommand, which reads this process's environment.
#pragma once

#include <string>

#include "run/hosts.h"
#include "run/join_file.h"
#include "run/launcher.h"

namespace shoal::run {

// What every rank of one attempt of the job shares.
struct JobEnvironment {
  int worldSize = 0;  // ranks started at launch: SHOAL_WORLD_SIZE, membership's first view
  int numHosts = 1;
  int workers = 0;           // launch slots below this are workers, the rest parameter servers
  std::string storeAddress;  // SHOAL_STORE_ADDR: host:port, or an etcd URL
  // MASTER_ADDR and MASTER_PORT, for a store the launcher hosts; empty: none (etcd).
  std::string storeHost;
  std::string storePort;
  std::string secret;  // for the join file only
  int attempt = 0;     // SHOAL_RESTART_COUNT: the whole job's restarts before this attempt
};

// Slot `rank`'s variables at `where`; `member`: its elastic member id. The options' -x
// variables come last (the user's word wins).
Variables rankVariables(const LaunchOptions& o, const JobEnvironment& job, const Placement& where,
                        int rank, int member);

// A join file's variables: every worker's but its slot's, with the secret and the store's
// SHOAL_ENCRYPT.
Variables joinVariables(const LaunchOptions& o, const JobEnvironment& job);

// What an ssh host runs for a remote rank: this process's SHOAL_* variables (ssh forwards no
// environment) but those `vars` sets and the secret, then `vars`, then the command (its program
// replaced by `program`), in this process's working directory.
std::string remoteRankCommand(const LaunchOptions& o, const std::string& program,
                              const Variables& vars);

// The names of `vars`, then `more`. Pure.
std::vector<std::string> namesOf(const Variables& vars, std::vector<std::string> more);

}  // namespace shoal::run
