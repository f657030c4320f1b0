#include "comm/native/op_context.h"

#include "comm/native/native_engine.h"

namespace shoal::comm {

using transport::FrameHeader;
using transport::Transfer;

namespace {
// The "blocked" marker of a slow batch (Note [Bounded diagnostics] in native_engine.cpp).
constexpr Duration kPostBudget = std::chrono::milliseconds(100);
}  // namespace

OpContext::OpContext(NativeEngine& engine, FrameHeader base, const Deadline& deadline)
    : engine_(engine), base_(base), deadline_(deadline) {}

int OpContext::rank() const {
  return engine_.rank();
}
int OpContext::size() const {
  return engine_.size();
}

FrameHeader OpContext::header(uint32_t step, uint64_t bytes) const {
  FrameHeader h = base_;
  h.step = step;
  h.bytes = bytes;
  return h;
}

Transfer OpContext::send(int peer, uint32_t step, const void* data, size_t bytes) const {
  return Transfer::send(peer, header(step, bytes), data);
}
Transfer OpContext::sendAsReady(int peer, uint32_t step, const void* data, size_t bytes,
                                const size_t* ready) const {
  return Transfer::sendAsReady(peer, header(step, bytes), data, ready);
}
Transfer OpContext::recv(int peer, uint32_t step, void* data, size_t bytes) const {
  return Transfer::recv(peer, header(step, bytes), data);
}
Transfer OpContext::recvReduce(int peer, uint32_t step, void* data, size_t bytes) const {
  return Transfer::recvReduce(peer, header(step, bytes), data, static_cast<DataType>(base_.dtype),
                              static_cast<ReduceOp>(base_.redop));
}
Transfer OpContext::recvReduceFinal(int peer, uint32_t step, void* data, size_t bytes) const {
  const auto op = static_cast<ReduceOp>(base_.redop);
  return Transfer::recvReduce(peer, header(step, bytes), data, static_cast<DataType>(base_.dtype),
                              op, op == ReduceOp::kAvg ? size() : 1);
}

Transfer OpContext::recvApply(int peer, uint32_t step, size_t bytes,
                              transport::PieceHandler handler) const {
  return Transfer::recvApply(peer, header(step, bytes), handler);
}

void OpContext::run(std::vector<Transfer>& batch) {
  if (batch.empty()) return;
  // Only an operation blocked for a while says so in the store, for the timeout report of
  // whichever rank gives up first (NativeEngine::arrivalReport). Nothing is done on the fast
  // path, and the slow path never waits long on the store (Note [Bounded diagnostics]).
  bool posted = false;
  auto onSlow = [&] {
    posted = engine_.diagnostics_.set(kPostBudget, fmt::format("blocked/{}", engine_.rank()),
                                      describeOp(base_));
  };
  engine_.endpoint().run(batch.data(), batch.size(), deadline_, onSlow, engine_.firstArrival_);
  if (posted) {
    engine_.diagnostics_.run(Duration(0), [key = fmt::format("blocked/{}", engine_.rank())](
                                              store::Store& s) { s.deleteKey(key); });
  }
}

}  // namespace shoal::comm
