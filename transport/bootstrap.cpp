#include "transport/bootstrap.h"

#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "transport/shm/doorbell.h"

namespace shoal::transport {

std::unique_ptr<Endpoint> bootstrapEndpoint(const BootstrapOptions& o) {
  LinkPlan plan;
  plan.rank = o.rank;
  plan.size = o.size;
  plan.groupId = o.groupId;
  if (o.size == 1) {
    plan.kinds.assign(1, LinkKind::kTcp);
    plan.peers.resize(1);
    return std::make_unique<Endpoint>(std::make_shared<Mesh>(std::move(plan)), nullptr, o.endpoint);
  }
  SHOAL_CHECK(o.acceptor != nullptr, "rank {}: a group of {} needs an acceptor", o.rank, o.size);
  plan.secret = o.secret;
  plan.encrypt = o.encrypt;
  plan.shmRingBytes = o.shmRingBytes;
  plan.timeout = o.timeout;
  if (o.transport != TransportKind::kTcp) {
    plan.bell = shm::Segment::create(sizeof(shm::DoorbellWord), "shoal-doorbell");
  }
  plan.self = {o.acceptor->address(), o.hostLabel.empty() ? shm::hostIdentity() : o.hostLabel,
               ::getpid(), plan.bell ? plan.bell->fd() : -1};
  // Until the endpoint registers, a peer's dial for this group is parked by the acceptor; if
  // this rank never gets there, it is refused as departed (no peer waits for its deadline).
  struct Abandon {
    Acceptor* acceptor;
    uint32_t id;
    ~Abandon() {
      if (acceptor) acceptor->remove(id);
    }
  } abandon{o.acceptor.get(), o.groupId};
  o.store->set(fmt::format("peer/{}", o.rank), encodeRecord(plan.self));
  Deadline deadline(o.timeout);
  plan.peers.resize(static_cast<size_t>(o.size));
  for (int p = 0; p < o.size; ++p) {
    if (p == o.rank) {
      plan.peers[p] = plan.self;
      continue;
    }
    try {
      plan.peers[p] =
          decodeRecord(o.store->get(fmt::format("peer/{}", p), deadline.remaining()), p);
    } catch (const TimeoutError&) {
      SHOAL_THROW(TimeoutError, "rank {}: rank {} did not join the group within {:.1f} s", o.rank,
                  p, deadline.timeoutSeconds());
    }
  }
  planLinks(plan, o.transport);
  for (int p = 0; p < o.size; ++p) {
    if (p != o.rank)
      SHOAL_LOG_DEBUG("rank {} ↔ peer {}: {} (planned)", o.rank, p, toString(plan.kinds[p]));
  }
  auto endpoint =
      std::make_unique<Endpoint>(std::make_shared<Mesh>(std::move(plan)), o.acceptor, o.endpoint);
  abandon.acceptor = nullptr;
  return endpoint;
}

}  // namespace shoal::transport
