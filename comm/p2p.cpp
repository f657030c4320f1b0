// Point-to-point entry points: argument checks, then the group's engine (the native engine's
// (peer, tag) channels: comm/native/p2p_channel.h; MPI's send / recv in issue order).
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

void checkOp(const Group& g, const void* data, size_t count, DataType type, int peer, int tag,
             const char* what) {
  detail::checkBuffer(g, data, count, type, what);
  if (peer < 0 || peer >= g.size() || peer == g.rank()) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: peer {} must be another rank of 0..{}", g.rank(),
                what, peer, g.size() - 1);
  }
  if (tag < 0)
    SHOAL_THROW(InvalidArgument, "rank {}: {}: tag {} must be >= 0", g.rank(), what, tag);
  if (tag != 0 && !g.engine().supportsTags()) {
    SHOAL_THROW(InvalidArgument,
                "rank {}: {}: tag {}: the {} engine runs point-to-point with tag 0 only", g.rank(),
                what, tag, g.engineName());
  }
}

Operation message(bool isSend, void* data, size_t count, DataType type, int peer, int tag) {
  return {.op = op::kSendRecv,
          .send = isSend ? data : nullptr,
          .recv = isSend ? nullptr : data,
          .count = count,
          .type = type,
          .root = peer,
          .isSend = isSend,
          .tag = tag};
}

std::shared_ptr<Work> post(Group& g, bool isSend, void* data, size_t count, DataType type, int peer,
                           int tag, const CallOptions& call) {
  return g.post(message(isSend, data, count, type, peer, tag), call);
}

}  // namespace

std::shared_ptr<Work> isend(Group& g, const void* data, size_t count, DataType type, int peer,
                            int tag, const CallOptions& call) {
  checkOp(g, data, count, type, peer, tag, "isend");
  return post(g, true, const_cast<void*>(data), count, type, peer, tag, call);
}

std::shared_ptr<Work> irecv(Group& g, void* data, size_t count, DataType type, int peer, int tag,
                            const CallOptions& call) {
  checkOp(g, data, count, type, peer, tag, "irecv");
  return post(g, false, data, count, type, peer, tag, call);
}

std::shared_ptr<Work> batchIsendIrecv(Group& g, const std::vector<P2pOp>& ops,
                                      const CallOptions& call) {
  for (const auto& op : ops) {
    checkOp(g, op.data, op.count, op.type, op.peer, op.tag,
            op.kind == P2pOp::Kind::kSend ? "batch send" : "batch receive");
  }
  std::vector<std::shared_ptr<Work>> works;
  works.reserve(ops.size());
  for (const auto& op : ops) {
    works.push_back(
        post(g, op.kind == P2pOp::Kind::kSend, op.data, op.count, op.type, op.peer, op.tag, call));
  }
  return Work::all(works);
}

void send(Group& g, const void* data, size_t count, DataType type, int peer,
          const CallOptions& call) {
  checkOp(g, data, count, type, peer, 0, "send");
  g.transfer(message(true, const_cast<void*>(data), count, type, peer, 0), call);
}

void recv(Group& g, void* data, size_t count, DataType type, int peer, const CallOptions& call) {
  checkOp(g, data, count, type, peer, 0, "recv");
  g.transfer(message(false, data, count, type, peer, 0), call);
}

std::shared_ptr<Work> sendAsync(Group& g, const void* data, size_t count, DataType type, int peer,
                                const CallOptions& call) {
  return isend(g, data, count, type, peer, 0, call);
}

std::shared_ptr<Work> recvAsync(Group& g, void* data, size_t count, DataType type, int peer,
                                const CallOptions& call) {
  return irecv(g, data, count, type, peer, 0, call);
}

}  // namespace shoal::comm
