#include "run/init.h"

#include "comm/mpi/mpi_backend.h"
#include "common/error.h"
#include "common/log.h"
#include "common/socket.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "transport/auth.h"

namespace shoal {

namespace {

using run::Launcher;

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

std::shared_ptr<store::TcpStore> hostStore(const run::Rendezvous& r, int port, int* boundPort,
                                           Duration timeout) {
  std::unique_ptr<store::TcpStoreServer> server;
  try {
    server = std::make_unique<store::TcpStoreServer>("0.0.0.0", port);
  } catch (const SystemError& e) {
    SHOAL_THROW(SystemError,
                "rank {} ({}): cannot host the job's store on port {}: {} (choose "
                "another port with MASTER_PORT)",
                r.rank, toString(r.launcher), port, e.what());
  }
  *boundPort = server->port();
  auto store = std::make_shared<store::TcpStore>(HostPort{"127.0.0.1", server->port()}, timeout);
  store->keepServer(std::move(server));
  return store;
}

}  // namespace

World init() {
  const EnvConfig env = readEnvConfig();
  setLogLevel(env.logLevel);
  const run::Rendezvous r = run::detectRendezvous(run::processEnv());
  comm::GroupOptions options = comm::GroupOptions::from(env);
  World w;
  w.rank = r.rank;
  w.size = r.size;
  w.localRank = r.localRank;
  w.localSize = r.localSize;
  w.launcher = r.launcher;
  w.role = r.role;
  w.roleRank = r.roleRank;
  w.numServers = r.numServers;
  if (r.rank == 0) {
    SHOAL_LOG_INFO("started by {}: {} ranks on {} host(s); configuration: {}", toString(r.launcher),
                   r.size, r.hosts, describe(env));
  }

  if (env.backend == "mpi") {
    auto backend = comm::mpi::worldBackend();
    if (r.launcher != Launcher::kNone && (backend->rank() != r.rank || backend->size() != r.size)) {
      SHOAL_THROW(InvalidArgument,
                  "SHOAL_BACKEND=mpi: MPI says rank {} of {}, {} says rank {} of {} (start the "
                  "job with mpirun)",
                  backend->rank(), backend->size(), toString(r.launcher), r.rank, r.size);
    }
    w.rank = backend->rank();
    w.size = backend->size();
    w.group = comm::Group::create(std::move(backend), options);
    return w;
  }

  if (r.launcher == Launcher::kNone) {
    w.group = comm::Group::create(std::make_shared<store::MemoryStore>(), 0, 1, options);
    return w;
  }

  std::shared_ptr<store::TcpStore> store;
  std::string storeHost = r.storeHost;
  if (r.launcher == Launcher::kMpirun && storeHost.empty()) {
    // Rank 0 hosts the store on a free port and tells the others where, with the job secret
    // if none is configured, over MPI (which mpirun already connected and trusts).
    std::string message;
    if (r.rank == 0) {
      int port = 0;
      store = hostStore(r, r.storePort, &port, options.timeout);
      const std::string host =
          r.hosts <= 1 ? "127.0.0.1"
                       : env.listenAddress.value_or(firstExternalIPv4().value_or("127.0.0.1"));
      message =
          fmt::format("{}:{}\n{}", host, port,
                      options.secret || options.secretFile ? "" : transport::generateSecret());
    }
    message = comm::mpi::broadcastFromRankZero(message, options.timeout);
    const auto newline = message.find('\n');
    SHOAL_CHECK(newline != std::string::npos, "mpirun rendezvous: malformed message");
    HostPort hp = parseHostPort(message.substr(0, newline));
    storeHost = hp.host;
    if (newline + 1 < message.size()) options.secret = message.substr(newline + 1);
    if (!store) store = std::make_shared<store::TcpStore>(hp, options.timeout);
  } else if (r.hostsStore) {
    int port = 0;
    store = hostStore(r, r.storePort, &port, options.timeout);
  } else {
    store = std::make_shared<store::TcpStore>(HostPort{storeHost, r.storePort}, options.timeout);
  }
  if (!env.listenAddress) options.listenAddress = advertisedAddress(r, storeHost);
  w.group = comm::Group::create(store, r.rank, r.size, options);
  return w;
}

}  // namespace shoal
