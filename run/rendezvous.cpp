#include "run/rendezvous.h"

#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "common/socket.h"
#include "run/node_secret.h"
#include "store/etcd_store.h"

namespace shoal::run {

namespace {

int parseInt(const std::string& name, const std::string& v, int min) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > (1 << 24)) {
    SHOAL_THROW(InvalidArgument, "{}='{}': expected an integer >= {}", name, v, min);
  }
  return static_cast<int>(n);
}

struct Reader {
  const EnvLookup& env;
  const char* launcher;

  std::optional<std::string> get(const std::string& name) const { return env(name); }
  std::string need(const std::string& name) const {
    auto v = env(name);
    if (!v) SHOAL_THROW(InvalidArgument, "{}: {} is not set", launcher, name);
    return *v;
  }
  int needInt(const std::string& name, int min) const { return parseInt(name, need(name), min); }
  std::optional<int> getInt(const std::string& name, int min) const {
    auto v = env(name);
    if (!v) return std::nullopt;
    return parseInt(name, *v, min);
  }
  // The first variable of `names` that is set.
  std::optional<std::string> first(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      if (auto v = env(n)) return v;
    }
    return std::nullopt;
  }
};

void checkRank(const Rendezvous& r, const char* launcher, bool elastic = false) {
  if (r.rank >= r.size && !elastic) {
    SHOAL_THROW(InvalidArgument, "{}: rank {} is not below the world size {}", launcher, r.rank,
                r.size);
  }
  if (r.localRank >= r.localSize) {
    SHOAL_THROW(InvalidArgument, "{}: local rank {} is not below the local size {}", launcher,
                r.localRank, r.localSize);
  }
}

// SHOAL_STORE_ADDR, or MASTER_ADDR + MASTER_PORT, when set.
bool storeOverride(const Reader& in, Rendezvous& r) {
  if (auto addr = in.get("SHOAL_STORE_ADDR")) {
    if (store::EtcdAddress::matches(*addr)) {
      store::EtcdAddress::parse(*addr);  // checked here, where the variable is named
      r.storeUrl = *addr;
      r.hostsStore = false;
      return true;
    }
    HostPort hp = parseHostPort(*addr);
    r.storeHost = hp.host;
    r.storePort = hp.port;
    return true;
  }
  auto host = in.get("MASTER_ADDR");
  auto port = in.getInt("MASTER_PORT", 1);
  if (host && port) {
    r.storeHost = *host;
    r.storePort = *port;
    return true;
  }
  if (port) r.storePort = *port;
  return false;
}

}  // namespace

std::string_view toString(Role r) {
  return r == Role::kServer ? "server" : "worker";
}

namespace {

// The last SHOAL_NUM_SERVERS ranks serve; SHOAL_ROLE / SHOAL_ROLE_RANK, if set, must agree.
void assignRole(const EnvLookup& env, Rendezvous& r) {
  Reader in{env, "roles"};
  r.numServers = in.getInt("SHOAL_NUM_SERVERS", 0).value_or(0);
  if (r.numServers >= r.size && r.numServers > 0) {
    SHOAL_THROW(InvalidArgument, "SHOAL_NUM_SERVERS={} leaves no worker in a world of {}",
                r.numServers, r.size);
  }
  r.psReplicas = static_cast<int>(in.getInt("SHOAL_PS_REPLICAS", 1).value_or(1));
  r.restartCount = static_cast<int>(in.getInt("SHOAL_RESTART_COUNT", 0).value_or(0));
  if (r.psReplicas != 1 && r.psReplicas != 2) {
    SHOAL_THROW(InvalidArgument, "SHOAL_PS_REPLICAS={}: 1 or 2", r.psReplicas);
  }
  if (r.psReplicas == 2 && r.numServers < 2) {
    SHOAL_THROW(InvalidArgument,
                "SHOAL_PS_REPLICAS=2 needs at least 2 servers (SHOAL_NUM_SERVERS={})",
                r.numServers);
  }
  const int workers = r.size - r.numServers;
  // An elastic job is workers only (checked in detectRendezvous), and its ranks past the launch
  // size are workers that joined later (shoal join), not servers.
  const bool worker = r.rank < workers || (env("SHOAL_ELASTIC").has_value() && r.numServers == 0);
  r.role = worker ? Role::kWorker : Role::kServer;
  r.roleRank = worker ? r.rank : r.rank - workers;
  if (auto role = in.get("SHOAL_ROLE"); role && *role != toString(r.role)) {
    SHOAL_THROW(InvalidArgument, "SHOAL_ROLE={} but rank {} of {} with {} servers is a {}", *role,
                r.rank, r.size, r.numServers, toString(r.role));
  }
  if (auto rr = in.getInt("SHOAL_ROLE_RANK", 0); rr && *rr != r.roleRank) {
    SHOAL_THROW(InvalidArgument, "SHOAL_ROLE_RANK={} but rank {} is {} {}", *rr, r.rank,
                toString(r.role), r.roleRank);
  }
  r.psReplacement = static_cast<int>(in.getInt("SHOAL_PS_REPLACEMENT", 0).value_or(0));
  if (r.psReplacement > 0 && (r.role != Role::kServer || r.psReplicas != 2)) {
    SHOAL_THROW(InvalidArgument,
                "SHOAL_PS_REPLACEMENT={}: only a parameter server of a job with "
                "SHOAL_PS_REPLICAS=2 is started as a replacement (rank {} is {} {}, replicas {})",
                r.psReplacement, r.rank, toString(r.role), r.roleRank, r.psReplicas);
  }
}

Rendezvous detectLauncher(const EnvLookup& env);

}  // namespace

Rendezvous detectRendezvous(const EnvLookup& env) {
  Rendezvous r = detectLauncher(env);
  assignRole(env, r);
  Reader in{env, "elastic jobs"};
  r.elastic = in.get("SHOAL_ELASTIC");
  // "auto": a worker started by hand (shoal join) takes its id from the store (run/join_file.h).
  if (env("SHOAL_ELASTIC_MEMBER") == std::optional<std::string>("auto")) {
    r.memberId = -1;
  } else {
    r.memberId = in.getInt("SHOAL_ELASTIC_MEMBER", 0).value_or(r.rank);
  }
  if (auto wait = in.get("SHOAL_ELASTIC_WAIT")) {
    r.elasticWaitSeconds = parseNumber("SHOAL_ELASTIC_WAIT", *wait, 0.001, 1e6);
  }
  if (r.elastic && r.numServers > 0) {
    SHOAL_THROW(InvalidArgument,
                "SHOAL_ELASTIC with parameter servers (SHOAL_NUM_SERVERS={}): elastic jobs are "
                "workers only",
                r.numServers);
  }
  return r;
}

std::string_view toString(Launcher l) {
  switch (l) {
    case Launcher::kNone:
      return "none";
    case Launcher::kShoal:
      return "shoal run";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSlurm:
      return "slurm";
    case Launcher::kKubernetes:
      return "kubernetes";
  }
  return "invalid";
}

std::string firstSlurmNode(std::string_view list) {
  auto bracket = list.find('[');
  auto comma = list.find(',');
  if (bracket == std::string_view::npos || (comma != std::string_view::npos && comma < bracket)) {
    return std::string(list.substr(0, comma));
  }
  // prefix[a-b,c...]: the first element of the range list, zero padding kept.
  std::string_view inside = list.substr(bracket + 1);
  auto end = inside.find_first_of("-,]");
  if (end == std::string_view::npos || end == 0) {
    SHOAL_THROW(InvalidArgument, "slurm: malformed node list '{}'", list);
  }
  return std::string(list.substr(0, bracket)) + std::string(inside.substr(0, end));
}

std::vector<int> expandSlurmTasksPerNode(std::string_view spec) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t next = spec.find(',', pos);
    std::string item(
        spec.substr(pos, next == std::string_view::npos ? spec.size() - pos : next - pos));
    int count = 0, repeat = 1;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d(x%d%c", &count, &repeat, &tail) == 3 && tail == ')') {
    } else if (std::sscanf(item.c_str(), "%d%c", &count, &tail) == 1) {
      repeat = 1;
    } else {
      SHOAL_THROW(InvalidArgument, "slurm: malformed tasks per node '{}'", spec);
    }
    if (count < 1 || repeat < 1 || repeat > 100000) {
      SHOAL_THROW(InvalidArgument, "slurm: malformed tasks per node '{}'", spec);
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (next == std::string_view::npos) break;
    pos = next + 1;
  }
  if (out.empty()) SHOAL_THROW(InvalidArgument, "slurm: empty tasks per node");
  return out;
}

namespace {

Rendezvous detectLauncher(const EnvLookup& env) {
  Rendezvous r;
  if (env("SHOAL_RANK")) {
    Reader in{env, "shoal run"};
    r.launcher = Launcher::kShoal;
    r.rank = in.needInt("SHOAL_RANK", 0);
    r.size = in.needInt("SHOAL_WORLD_SIZE", 1);
    r.localRank = in.getInt("SHOAL_LOCAL_RANK", 0).value_or(r.rank);
    r.localSize = in.getInt("SHOAL_LOCAL_WORLD_SIZE", 1).value_or(r.size);
    r.hosts = in.getInt("SHOAL_NUM_HOSTS", 1).value_or(1);
    storeOverride(in, r);
    if (r.storeUrl.empty() && r.storeHost.empty()) in.need("SHOAL_STORE_ADDR");
    // A worker of an elastic job started after the launch may have a launch slot beyond the
    // first view's size (SHOAL_WORLD_SIZE): its rank comes from the view it joins.
    checkRank(r, "shoal run", env("SHOAL_ELASTIC").has_value());
    return r;
  }
  if (env("OMPI_COMM_WORLD_RANK")) {
    Reader in{env, "mpirun"};
    r.launcher = Launcher::kMpirun;
    r.rank = in.needInt("OMPI_COMM_WORLD_RANK", 0);
    r.size = in.needInt("OMPI_COMM_WORLD_SIZE", 1);
    r.localRank = in.getInt("OMPI_COMM_WORLD_LOCAL_RANK", 0).value_or(0);
    r.localSize = in.getInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(1);
    r.hosts = r.localSize == r.size ? 1 : 2;  // at least two; the exact count is not needed
    r.hostsStore = r.rank == 0;
    storeOverride(in, r);
    checkRank(r, "mpirun");
    return r;
  }
  if (env("SLURM_PROCID")) {
    Reader in{env, "slurm"};
    r.launcher = Launcher::kSlurm;
    r.rank = in.needInt("SLURM_PROCID", 0);
    auto tasks = in.first({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
    if (!tasks) SHOAL_THROW(InvalidArgument, "slurm: SLURM_NTASKS is not set");
    r.size = parseInt("SLURM_NTASKS", *tasks, 1);
    r.localRank = in.getInt("SLURM_LOCALID", 0).value_or(0);
    if (auto perNode = in.first({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
      auto counts = expandSlurmTasksPerNode(*perNode);
      const int node = in.getInt("SLURM_NODEID", 0).value_or(0);
      if (node >= static_cast<int>(counts.size())) {
        SHOAL_THROW(InvalidArgument, "slurm: SLURM_NODEID={} but tasks per node '{}'", node,
                    *perNode);
      }
      r.localSize = counts[static_cast<size_t>(node)];
      r.hosts = static_cast<int>(counts.size());
    } else {
      r.localSize = r.size;
    }
    r.hosts = in.getInt("SLURM_STEP_NUM_NODES", 1)
                  .value_or(in.getInt("SLURM_JOB_NUM_NODES", 1).value_or(r.hosts));
    r.hostsStore = r.rank == 0;
    if (auto job = in.get("SLURM_JOB_ID")) {
      r.nodeSecretKey = slurmSecretKey(*job, in.get("SLURM_STEP_ID").value_or(""));
    }
    if (!storeOverride(in, r)) {
      auto nodes = in.first({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
      if (!nodes) SHOAL_THROW(InvalidArgument, "slurm: SLURM_JOB_NODELIST is not set");
      r.storeHost = firstSlurmNode(*nodes);
      if (r.storePort == 0) {
        r.storePort = 20000 + in.getInt("SLURM_JOB_ID", 0).value_or(0) % 20000;
      }
    }
    checkRank(r, "slurm");
    return r;
  }
  if (env("JOB_COMPLETION_INDEX")) {
    Reader in{env, "kubernetes"};
    r.launcher = Launcher::kKubernetes;
    r.rank = in.needInt("JOB_COMPLETION_INDEX", 0);
    auto size = in.first({"SHOAL_WORLD_SIZE", "WORLD_SIZE"});
    if (!size) {
      SHOAL_THROW(InvalidArgument,
                  "kubernetes: set SHOAL_WORLD_SIZE to the Job's completions (parallelism)");
    }
    r.size = parseInt("SHOAL_WORLD_SIZE", *size, 1);
    r.hosts = r.size;  // one pod per rank
    r.hostsStore = r.rank == 0;
    if (!storeOverride(in, r)) {
      const std::string service = in.need("SHOAL_K8S_SERVICE");
      std::string job;
      if (auto j = in.get("SHOAL_K8S_JOB")) {
        job = *j;
      } else {
        // An Indexed Job's pod is named <job>-<index> (its hostname).
        const std::string host = in.need("HOSTNAME");
        const std::string suffix = fmt::format("-{}", r.rank);
        if (host.size() <= suffix.size() ||
            host.compare(host.size() - suffix.size(), suffix.size(), suffix) != 0) {
          SHOAL_THROW(InvalidArgument,
                      "kubernetes: HOSTNAME '{}' does not end in -{} (set SHOAL_K8S_JOB to the "
                      "Job's name)",
                      host, r.rank);
        }
        job = host.substr(0, host.size() - suffix.size());
      }
      r.storeHost = job + "-0." + service;
      if (r.storePort == 0) r.storePort = 29400;
    }
    checkRank(r, "kubernetes");
    return r;
  }
  return r;
}

}  // namespace

std::string storeListenAddress(const Rendezvous& r,
                               const std::optional<std::string>& listenAddress) {
  // Clients connect to storeHost when there is one, so that is the address to be on.
  if (!r.storeHost.empty()) return resolveIPv4(r.storeHost).value_or("0.0.0.0");
  if (listenAddress) return *listenAddress;
  if (r.hosts <= 1) return "127.0.0.1";
  return firstExternalIPv4().value_or("127.0.0.1");
}

EnvLookup processEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

}  // namespace shoal::run
