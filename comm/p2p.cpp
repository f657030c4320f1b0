// Point-to-point send and receive. Each direction of each pair numbers its messages, so the
// k-th send matches the k-th receive and a disagreement on count or type is a MismatchError.
#include "comm/collective_util.h"
#include "comm/collectives.h"

namespace shoal::comm {

namespace {

void checkPeer(const Group& g, int peer, const char* what) {
  if (peer < 0 || peer >= g.size() || peer == g.rank()) {
    SHOAL_THROW(InvalidArgument, "rank {}: {}: peer {} must be another rank of 0..{}", g.rank(),
                what, peer, g.size() - 1);
  }
}

std::shared_ptr<Work> p2pImpl(Group& g, bool async, bool isSend, void* data, size_t count,
                              DataType type, int peer, const CallOptions& call) {
  const char* what = isSend ? "send" : "recv";
  detail::checkBuffer(g, data, count, type, what);
  checkPeer(g, peer, what);
  if (g.backend()) {
    BackendOp b{.op = transport::OpCode::kSendRecv,
                .send = isSend ? data : nullptr,
                .recv = isSend ? nullptr : data,
                .count = count,
                .type = type,
                .root = peer,
                .isSend = isSend};
    return g.runOnBackend(async, b, call);
  }
  auto base = detail::baseHeader(count, type);
  return detail::dispatch(
      g, async, transport::OpCode::kSendRecv, base, call, {}, [=, &g](OpContext& ctx) {
        auto h = ctx.header(0, count * elementSize(type));
        h.seq = isSend ? g.nextSendSeq(peer) : g.nextRecvSeq(peer);
        std::vector<transport::Transfer> batch{isSend ? transport::Transfer::send(peer, h, data)
                                                      : transport::Transfer::recv(peer, h, data)};
        ctx.run(batch);
      });
}

}  // namespace

void send(Group& g, const void* data, size_t count, DataType type, int peer,
          const CallOptions& call) {
  p2pImpl(g, false, true, const_cast<void*>(data), count, type, peer, call);
}

void recv(Group& g, void* data, size_t count, DataType type, int peer, const CallOptions& call) {
  p2pImpl(g, false, false, data, count, type, peer, call);
}

std::shared_ptr<Work> sendAsync(Group& g, const void* data, size_t count, DataType type, int peer,
                                const CallOptions& call) {
  return p2pImpl(g, true, true, const_cast<void*>(data), count, type, peer, call);
}

std::shared_ptr<Work> recvAsync(Group& g, void* data, size_t count, DataType type, int peer,
                                const CallOptions& call) {
  return p2pImpl(g, true, false, data, count, type, peer, call);
}

}  // namespace shoal::comm
