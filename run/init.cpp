#include "run/init.h"

#include <unistd.h>

#include <filesystem>

#include "comm/native/native_engine.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/log.h"
#include "common/socket.h"
#include "run/init_backend.h"
#include "run/join_file.h"
#include "run/node_secret.h"
#include "store/etcd_store.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "transport/auth.h"

namespace shoal {

namespace {

using run::Launcher;

// Plain init() (no MPI linked): what to do instead.
// A worker started by hand (shoal join, run/join_file.h): the next id of the job's counter,
// above every id the launcher gives out.
int outsideMemberId(store::Store& store) {
  const int64_t n = store.add("elastic/outside-members", 1);
  if (n < 1 || n > (int64_t{1} << 30)) {
    SHOAL_THROW(ProtocolError, "elastic membership: the store's member counter says {}", n);
  }
  return run::kFirstOutsideMember + static_cast<int>(n - 1);
}

constexpr const char* kLinkMpi = "link Shoal::mpi and call shoal::initWithMpi() (run/init_mpi.h)";

// The address other hosts reach this rank at: on one host, loopback; across hosts, the
// address that routes to the store (not a loopback alias such as Debian's 127.0.1.1 entry for
// the own hostname), else the first external interface.
std::string advertisedAddress(const run::Rendezvous& r, const std::string& storeHost) {
  if (r.hosts <= 1) return "127.0.0.1";
  if (auto a = sourceAddressFor(storeHost); a && !isLoopback(*a)) return *a;
  if (auto a = firstExternalIPv4()) return *a;
  SHOAL_THROW(InvalidArgument,
              "rank {}: found no non-loopback address to reach the other hosts; set SHOAL_ADDR",
              r.rank);
}

// Hosts the job's store on the address its clients use, authenticated with `secret` (empty
// only when the job has no secret: see store/tcp_store.h).
std::shared_ptr<store::TcpStore> hostStore(const run::Rendezvous& r, const std::string& host,
                                           int port, int* boundPort, Duration timeout,
                                           const std::string& secret, EncryptMode encrypt) {
  std::unique_ptr<store::TcpStoreServer> server;
  try {
    store::TcpStoreServerOptions so;
    so.secret = secret;
    so.encrypt = encrypt;
    server = std::make_unique<store::TcpStoreServer>(host, port, so);
  } catch (const SystemError& e) {
    SHOAL_THROW(SystemError,
                "rank {} ({}): cannot host the job's store on port {}: {} (choose "
                "another port with MASTER_PORT)",
                r.rank, toString(r.launcher), port, e.what());
  }
  *boundPort = server->port();
  // The port actually bound (the OS's choice when asked for port 0): what a user or a test
  // passes on to ranks started separately.
  SHOAL_LOG_INFO("rank {} ({}) hosts the job's store on port {}", r.rank, toString(r.launcher),
                 server->port());
  // Connect where the clients do: the server may not be on loopback.
  const std::string local = host == "0.0.0.0" ? "127.0.0.1" : host;
  auto store =
      std::make_shared<store::TcpStore>(HostPort{local, server->port()}, timeout, secret, encrypt);
  store->keepServer(std::move(server));
  return store;
}

// The secret the store is authenticated with: SHOAL_SECRET, else SHOAL_SECRET_FILE's contents
// (shareNodeSecret sets the first where a launcher hands over none).
std::string storeSecret(const comm::GroupOptions& o) {
  if (o.secret) return *o.secret;
  if (o.secretFile) {
    store::MemoryStore unused;
    return transport::resolveJobSecret(std::nullopt, o.secretFile, unused, 0, Duration(0)).bytes;
  }
  return {};
}

// Slurm and Kubernetes start ranks with nothing shared but the environment, so without a
// configured secret the store would have to be open: the generated secret used to travel
// through the store itself. Instead, Slurm tasks on one node share a secret generated for the
// job step through a private directory (run/node_secret.h), which authenticates the store and
// every connection; ranks on several nodes or pods are refused before any store is open.
// mpirun given a store address (SHOAL_STORE_ADDR, MASTER_ADDR) has connected its ranks already:
// rank 0 sends them a generated secret over MPI, as the rendezvous over MPI does; a program
// without MPI is refused, as nothing else could carry one.
// Sets options.secret; the returned file goes when the caller drops it.
run::NodeSecret shareGeneratedSecret(const run::Rendezvous& r, comm::GroupOptions& options,
                                     const run::MpiBridge* mpi) {
  if (options.secret || options.secretFile || !r.storeUrl.empty() || r.size <= 1) return {};
  if (r.launcher == Launcher::kMpirun && !r.storeHost.empty()) {
    if (!mpi) {
      SHOAL_THROW(InvalidArgument,
                  "mpirun: a store address (SHOAL_STORE_ADDR or MASTER_ADDR) without "
                  "SHOAL_SECRET would open the store to anyone who reaches it: set SHOAL_SECRET "
                  "or SHOAL_SECRET_FILE, or {} so that rank 0 sends the ranks a generated one",
                  kLinkMpi);
    }
    options.secret = mpi->broadcastFromRankZero(
        r.rank == 0 ? transport::generateSecret() : std::string(), options.timeout);
    if (r.rank == 0) {
      SHOAL_LOG_INFO(
          "rank 0 (mpirun): no SHOAL_SECRET; generated one and sent it to the {} ranks "
          "over MPI",
          r.size);
    }
    return {};
  }
  if (r.launcher == Launcher::kKubernetes || (r.launcher == Launcher::kSlurm && r.hosts > 1)) {
    SHOAL_THROW(InvalidArgument,
                "{}: a job across {} {} needs a shared secret: set SHOAL_SECRET or "
                "SHOAL_SECRET_FILE (README \"Security\")",
                toString(r.launcher), r.hosts,
                r.launcher == Launcher::kKubernetes ? "pods" : "nodes");
  }
  if (r.launcher != Launcher::kSlurm) return {};
  if (r.nodeSecretKey.empty()) {
    SHOAL_THROW(InvalidArgument,
                "slurm: SLURM_JOB_ID is not set, so the tasks cannot share a generated secret: "
                "set SHOAL_SECRET");
  }
  if (r.hostsStore) {
    run::NodeSecret s = run::publishNodeSecret(r.nodeSecretKey);
    options.secret = s.secret;
    SHOAL_LOG_INFO("rank 0 (slurm): no SHOAL_SECRET; generated one for the {} tasks on this node",
                   r.size);
    return s;
  }
  options.secret = run::awaitNodeSecret(r.nodeSecretKey, r.rank, options.timeout);
  return {};
}

// SHOAL_FLIGHT_DIR: this process's recorder, DIR/flight.rank<R> (R: the rank the launcher
// gave, which stays the same for an elastic worker whose rank in the world changes).
std::shared_ptr<FlightRecorder> openFlightRecorder(const EnvConfig& env, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(*env.flightDir, ec);
  if (ec) {
    SHOAL_THROW(InvalidArgument, "SHOAL_FLIGHT_DIR={}: cannot create it: {}", *env.flightDir,
                ec.message());
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::make_shared<FlightRecorder>(*env.flightDir + "/" + flightFileName(rank),
                                          env.flightEvents, rank, host);
}

// The world as the launcher describes it (everything init() does but tracing).
World joinWorld(const EnvConfig& env, const run::MpiBridge* mpi) {
  const run::Rendezvous r = run::detectRendezvous(run::processEnv());
  comm::GroupOptions options = comm::GroupOptions::from(env);
  // A replacement parameter server keeps no record of its own: its file would be the lost
  // process's (the same rank), which the launcher reads to tell what happened to it.
  if (env.flightDir && r.psReplacement == 0) options.flight = openFlightRecorder(env, r.rank);
  World w;
  w.rank = r.rank;
  w.size = r.size;
  w.localRank = r.localRank;
  w.localSize = r.localSize;
  w.launcher = r.launcher;
  w.role = r.role;
  w.roleRank = r.roleRank;
  w.numServers = r.numServers;
  w.psReplicas = r.psReplicas;
  w.psReplacement = r.psReplacement;
  w.restartCount = r.restartCount;
  if (r.rank == 0) {
    SHOAL_LOG_INFO("started by {}: {} ranks on {} host(s); configuration: {}", toString(r.launcher),
                   r.size, r.hosts, describe(env));
  }

  if (r.elastic && (env.backend == "mpi" || r.hostsStore || r.launcher == Launcher::kNone ||
                    (r.launcher == Launcher::kMpirun && r.storeHost.empty()))) {
    SHOAL_THROW(InvalidArgument,
                "SHOAL_ELASTIC={}: an elastic job needs a store that outlives every worker and "
                "the native engine (start it with shoal run --elastic, or set SHOAL_STORE_ADDR)",
                *r.elastic);
  }

  if (env.backend == "mpi") {
    // Without mpirun (or srun) MPI_Init makes a world of one: every rank would train alone and
    // nothing would say so. Refused before MPI is touched.
    if (r.launcher != Launcher::kMpirun && r.launcher != Launcher::kSlurm) {
      SHOAL_THROW(InvalidArgument,
                  "SHOAL_BACKEND=mpi needs a job started by mpirun (or Slurm's srun); this process "
                  "was {} (unset SHOAL_BACKEND, or start it with mpirun -n N)",
                  r.launcher == Launcher::kNone
                      ? std::string("started plainly")
                      : fmt::format("started by {}", toString(r.launcher)));
    }
    if (!mpi) {
      SHOAL_THROW(InvalidArgument, "SHOAL_BACKEND=mpi: this program was built without MPI ({})",
                  kLinkMpi);
    }
    auto engine = mpi->worldEngine();
    if (r.launcher != Launcher::kNone && (engine->rank() != r.rank || engine->size() != r.size)) {
      SHOAL_THROW(InvalidArgument,
                  "SHOAL_BACKEND=mpi: MPI says rank {} of {}, {} says rank {} of {} (start the "
                  "job with mpirun)",
                  engine->rank(), engine->size(), toString(r.launcher), r.rank, r.size);
    }
    w.rank = engine->rank();
    w.size = engine->size();
    w.group = comm::Group::create(std::move(engine), options);
    return w;
  }

  if (r.launcher == Launcher::kNone) {
    w.group = comm::Group::create(std::make_shared<store::MemoryStore>(), 0, 1, options);
    return w;
  }

  // Kept until the world is complete (run/node_secret.h).
  const run::NodeSecret nodeSecret = shareGeneratedSecret(r, options, mpi);
  std::shared_ptr<store::Store> store;
  std::string storeHost = r.storeHost;
  if (!r.storeUrl.empty()) {
    const auto etcd = store::EtcdAddress::parse(r.storeUrl);
    storeHost = etcd.address.host;
    store = std::make_shared<store::EtcdStore>(
        etcd, options.timeout, store::EtcdCredentials::fromEnvironment(processEnvReader()),
        store::EtcdTls::fromEnvironment(processEnvReader()));
  } else if (r.launcher == Launcher::kMpirun && storeHost.empty()) {
    // Rank 0 hosts the store on a free port and tells the others where, with the job secret
    // if none is configured, over MPI (which mpirun already connected and trusts).
    if (!mpi) {
      SHOAL_THROW(InvalidArgument,
                  "started by mpirun without SHOAL_STORE_ADDR, and this program has no MPI to "
                  "find the store over: set SHOAL_STORE_ADDR=host:port, or {}",
                  kLinkMpi);
    }
    std::string message;
    if (r.rank == 0) {
      // The secret comes first: the store authenticates its clients with it.
      if (!options.secret && !options.secretFile) options.secret = transport::generateSecret();
      const std::string host = run::storeListenAddress(r, env.listenAddress);
      int port = 0;
      store = hostStore(r, host, r.storePort, &port, options.timeout, storeSecret(options),
                        options.encrypt);
      message =
          fmt::format("{}:{}\n{}", host, port, env.secret || env.secretFile ? "" : *options.secret);
    }
    message = mpi->broadcastFromRankZero(message, options.timeout);
    const auto newline = message.find('\n');
    SHOAL_CHECK(newline != std::string::npos, "mpirun rendezvous: malformed message");
    HostPort hp = parseHostPort(message.substr(0, newline));
    storeHost = hp.host;
    if (newline + 1 < message.size()) options.secret = message.substr(newline + 1);
    if (!store) {
      store = std::make_shared<store::TcpStore>(hp, options.timeout, storeSecret(options),
                                                options.encrypt);
    }
  } else if (r.hostsStore) {
    int port = 0;
    store = hostStore(r, run::storeListenAddress(r, env.listenAddress), r.storePort, &port,
                      options.timeout, storeSecret(options), options.encrypt);
  } else {
    store = std::make_shared<store::TcpStore>(HostPort{storeHost, r.storePort}, options.timeout,
                                              storeSecret(options), options.encrypt);
  }
  if (!env.listenAddress) options.listenAddress = advertisedAddress(r, storeHost);
  if (r.elastic) {
    comm::MembershipOptions mo;
    mo.range = comm::ElasticRange::parse(*r.elastic);
    mo.initialSize = r.size;
    mo.startup = options.timeout;
    if (r.elasticWaitSeconds) {
      mo.waitForMembers = std::chrono::duration_cast<Duration>(
          std::chrono::duration<double>(*r.elasticWaitSeconds));
    }
    if (r.size > mo.range.maxSize) {
      SHOAL_THROW(InvalidArgument, "SHOAL_ELASTIC={}: {} workers started, above the maximum",
                  *r.elastic, r.size);
    }
    const int member = r.memberId >= 0 ? r.memberId : outsideMemberId(*store);
    comm::ElasticContext ctx{store, std::make_shared<comm::Membership>(store, member, mo), options};
    const comm::View view = ctx.membership->next(-1);
    w.group = comm::groupForView(ctx, view);
    w.rank = w.group->rank();
    w.size = w.group->size();
    w.elastic = std::move(ctx);
    return w;
  }
  if (r.psReplacement > 0) {
    // Note [Replacement servers] (ps/replacement.h): the running ranks will not form the world
    // again; this rank meets them in named groups under the world its earlier process joined.
    w.group = comm::attachToWorld(store, r.rank, options);
    return w;
  }
  w.group = comm::Group::create(store, r.rank, r.size, options);
  return w;
}

}  // namespace

World run::initWith(const MpiBridge* mpi) {
  const EnvConfig env = readEnvConfig();
  setLogLevel(env.logLevel);
  World w = joinWorld(env, mpi);
  // SHOAL_TRACE: the world's options carry the sink (GroupOptions::from); the session measures
  // the clock offset now, once the world exists, again at each resync() and at the end, and
  // writes this rank's file when it goes. Not in elastic jobs: a worker admitted later would
  // wait for peers that measured long ago.
  if (env.traceDir && w.psReplacement == 0) {
    w.trace = std::make_shared<run::TraceSession>(w.group, *env.traceDir, !w.elastic);
  }
  return w;
}

World init() {
  return run::initWith(nullptr);
}

}  // namespace shoal
