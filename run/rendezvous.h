// Who started this process, and what that tells a rank about itself and the job's store.
//
// Recognized, first match wins (the variables each system sets; README "Running on a cluster"):
// - shoal run:   SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_LOCAL_RANK, SHOAL_LOCAL_WORLD_SIZE,
//                SHOAL_STORE_ADDR (the launcher hosts the store);
// - mpirun:      OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; rank 0 hosts the store and
//                tells the others its address over MPI itself (unless MASTER_ADDR/PORT say);
// - Slurm srun:  SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//                SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE) with SLURM_NODEID; rank 0
//                hosts the store on the first node of SLURM_STEP_NODELIST (else
//                SLURM_JOB_NODELIST), port MASTER_PORT or 20000 + SLURM_JOB_ID mod 20000;
// - Kubernetes:  JOB_COMPLETION_INDEX of an Indexed Job, SHOAL_WORLD_SIZE (or WORLD_SIZE); rank 0
//                hosts the store at <job>-0.<SHOAL_K8S_SERVICE> (the pod's DNS name under its
//                headless Service; <job> is HOSTNAME without its index), port MASTER_PORT or
//                29400;
// - nothing:     a world of one.
// SHOAL_STORE_ADDR, or MASTER_ADDR with MASTER_PORT, override the store's address everywhere.
// Roles, under every launcher: with SHOAL_NUM_SERVERS=S the last S ranks of the world are
// parameter servers, the others workers (shoal run --servers sets it, and SHOAL_ROLE /
// SHOAL_ROLE_RANK, which must agree).
// Elastic jobs: SHOAL_ELASTIC=MIN:MAX and SHOAL_ELASTIC_MEMBER (see Rendezvous).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::run {

enum class Launcher { kNone, kShoal, kMpirun, kSlurm, kKubernetes };
std::string_view toString(Launcher l);

enum class Role { kWorker, kServer };
std::string_view toString(Role r);

struct Rendezvous {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  int hosts = 1;          // hosts the job spans, where known (1 for a single-host job)
  std::string storeHost;  // empty under mpirun without MASTER_ADDR: rank 0 says over MPI
  // SHOAL_STORE_ADDR=etcd://host:port[/namespace] (etcds:// for TLS): the store is etcd
  // (store/etcd_store.h) and no rank hosts one; storeHost and storePort are then unused.
  std::string storeUrl;
  int storePort = 0;
  bool hostsStore = false;  // this rank starts the store server (rank 0, without shoal run)
  // Slurm: the name of this job step's node secret (run/node_secret.h), for a job started
  // without SHOAL_SECRET; empty under other launchers.
  std::string nodeSecretKey;
  Role role = Role::kWorker;
  int roleRank = 0;  // among the ranks of its role
  int numServers = 0;
  // SHOAL_PS_REPLICAS: copies of each parameter-server shard, 1 (default) or 2 (needs at least
  // 2 servers; ps/server.h's Note [Replicated shards]).
  int psReplicas = 1;
  // SHOAL_PS_REPLACEMENT: above 0 on a parameter server that shoal run --ps-replacements
  // started again in a lost server's place (the n-th replacement of the job); 0 otherwise.
  int psReplacement = 0;
  // SHOAL_RESTART_COUNT: how many times shoal run --max-restarts (without --elastic) restarted
  // the whole job before this attempt; 0 on the first.
  int restartCount = 0;
  // Elastic jobs (shoal run --elastic): SHOAL_ELASTIC = "MIN:MAX" (run/membership.h), and this
  // worker's member id, SHOAL_ELASTIC_MEMBER (default: its rank; a worker started later gets a
  // new id and joins the running job; -1 for "auto": shoal::init() takes one from the store,
  // run/join_file.h).
  std::optional<std::string> elastic;
  int memberId = 0;
  // SHOAL_ELASTIC_WAIT: seconds the workers wait below the minimum (or to be admitted) before
  // failing; unset: comm::MembershipOptions' default.
  std::optional<double> elasticWaitSeconds;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Pure: reads only through `env`. Throws InvalidArgument naming the variable that is missing
// or malformed for the launcher it recognized.
Rendezvous detectRendezvous(const EnvLookup& env);

// The address the rank that hosts the store (r.hostsStore, or rank 0 under mpirun) listens on:
// the address its clients are told to use, never every interface by default. The store host's
// name resolved when the clients are given one (r.storeHost under Slurm, Kubernetes or
// MASTER_ADDR; 0.0.0.0 only if it does not resolve yet, as a Kubernetes pod's name may not);
// else (mpirun announces the address over MPI) SHOAL_ADDR (`listenAddress`) when set, loopback
// for a one-host job, the first external interface otherwise. Resolves names (DNS); throws
// nothing.
std::string storeListenAddress(const Rendezvous& r,
                               const std::optional<std::string>& listenAddress);

// The process environment as an EnvLookup (unset and empty read as nothing).
EnvLookup processEnv();

// Slurm's compressed lists: "node[01-04,07],gpu1" -> first name "node01".
std::string firstSlurmNode(std::string_view nodelist);
// "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expandSlurmTasksPerNode(std::string_view spec);

}  // namespace shoal::run
