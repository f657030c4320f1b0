// The one call a program makes to join its job: shoal::init() returns the world group whether
// the program was started by `shoal run`, mpirun, Slurm's srun, a Kubernetes Indexed Job, or
// plainly (a world of one). See run/rendezvous.h for what each launcher tells a rank.
//
// Blocking, bounded by the group timeout (SHOAL_TIMEOUT, default 60 s). Throws InvalidArgument
// naming a missing or malformed variable, StoreError / TimeoutError if the store cannot be
// reached, SystemError if this rank must host the store and its port is taken.
//
// Elastic jobs need the store to outlive every worker: shoal run hosts it (or SHOAL_STORE_ADDR
// names one); a rank-hosted store or SHOAL_BACKEND=mpi is refused (InvalidArgument).
//
// SHOAL_TRACE=DIR (set on every rank: measuring the clock offset at start-up is collective)
// records the timeline of every group made from the world (World::trace).
//
// SHOAL_BACKEND=mpi runs the collectives on OpenMPI (the job must be started by mpirun, or by
// srun with an MPI-aware launch); the default is Shoal's native engine.
#pragma once

#include <memory>

#include "comm/group.h"
#include "comm/membership.h"
#include "run/rendezvous.h"
#include "run/trace_session.h"

namespace shoal {

struct World {
  std::shared_ptr<comm::Group> group;
  int rank = 0;
  int size = 1;
  int localRank = 0;  // among the ranks on this host
  int localSize = 1;
  run::Launcher launcher = run::Launcher::kNone;
  // Parameter-server jobs (shoal run --servers, or SHOAL_NUM_SERVERS): the last numServers
  // ranks are servers; roleRank numbers the ranks of each role from 0.
  run::Role role = run::Role::kWorker;
  int roleRank = 0;
  int numServers = 0;
  // Copies of each parameter-server shard (shoal run --ps-replicas, SHOAL_PS_REPLICAS): pass it
  // to ps::ServerOptions::replicas and ps::ClientOptions::replicas.
  int psReplicas = 1;
  // Above 0 on a parameter server started in a lost server's place (shoal run
  // --ps-replacements; SHOAL_PS_REPLACEMENT): pass it to ps::ServerOptions::replacement. Such
  // a rank does not form the world again with the others: `group` is then a world of one that
  // meets them in named groups only (comm/native/native_engine.h's attachToWorld), so only the
  // parameter-server calls work on it. It is neither traced (SHOAL_TRACE) nor flight-recorded
  // (its recorder file would be the lost process's).
  int psReplacement = 0;
  // How many times `shoal run --max-restarts N` (without --elastic) restarted the whole job
  // before this attempt (SHOAL_RESTART_COUNT): 0 on the first. A program that checkpoints
  // resumes from its last checkpoint when this is above 0.
  int restartCount = 0;
  // Elastic jobs (shoal run --elastic MIN:MAX, SHOAL_ELASTIC): what train/elastic.h needs to
  // form each new view's group. rank and size are then the first view's (a worker that joins a
  // running job blocks in init() until the running workers admit it). Unset otherwise.
  std::optional<comm::ElasticContext> elastic;
  // SHOAL_TRACE=DIR: this rank's timeline (run/trace_session.h). Every group made from the
  // world's options records into its sink; the file DIR/trace.rank<R>.json is written when the
  // last copy of this World goes (or by trace->write()). Null when not tracing. Last member:
  // destroyed first, while the group still exists.
  std::shared_ptr<run::TraceSession> trace;
};

World init();

}  // namespace shoal
