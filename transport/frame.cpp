#include "transport/frame.h"

#include "common/error.h"

namespace shoal::transport {

std::string describeFrame(const FrameHeader& h) {
  return fmt::format("operation {} #{} of {} x {}", h.op, h.seq, h.count,
                     validDataType(h.dtype) ? toString(static_cast<DataType>(h.dtype)) : "?");
}

void checkFrame(const FrameHeader& e, const FrameHeader& g, const LinkContext& c,
                FrameDescriber describe) {
  if (g.magic != kFrameMagic) {
    SHOAL_THROW(ProtocolError,
                "rank {} ← peer {}: received bytes that are not a Shoal frame (magic 0x{:08x}) "
                "while expecting {}",
                c.rank, c.peer, g.magic, describe(e));
  }
  if (g.version != kProtocolVersion) {
    SHOAL_THROW(ProtocolError, "rank {} ← peer {}: protocol version {} but this rank speaks {}",
                c.rank, c.peer, g.version, kProtocolVersion);
  }
  if (g.kind != static_cast<uint8_t>(FrameKind::kData)) {
    SHOAL_THROW(ProtocolError, "rank {} ← peer {}: unknown frame kind {} while expecting {}",
                c.rank, c.peer, g.kind, describe(e));
  }
  if (g.group != e.group) {
    SHOAL_THROW(ProtocolError, "rank {} ← peer {}: frame for group {:08x} on group {:08x}", c.rank,
                c.peer, g.group, e.group);
  }
  if (g.op != e.op || g.seq != e.seq || g.count != e.count || g.dtype != e.dtype ||
      g.redop != e.redop || g.root != e.root) {
    SHOAL_THROW(MismatchError, "rank {} ← peer {}: rank {} is in {}, peer {} sent {}", c.rank,
                c.peer, c.rank, describe(e), c.peer, describe(g));
  }
  if (g.algo != e.algo) {
    SHOAL_THROW(MismatchError,
                "rank {} ← peer {}: {}: rank {} runs algorithm {}, peer {} runs algorithm {} "
                "(check SHOAL_ALLREDUCE_ALGORITHM and per-call overrides)",
                c.rank, c.peer, describe(e), c.rank, e.algo, c.peer, g.algo);
  }
  if (g.step != e.step || g.bytes != e.bytes) {
    SHOAL_THROW(ProtocolError,
                "rank {} ← peer {}: {}: frame for step {} with {} bytes, expected step {} with "
                "{} bytes",
                c.rank, c.peer, describe(e), g.step, g.bytes, e.step, e.bytes);
  }
}

Failure abortFailure(const FrameHeader& g, const std::string& text) {
  Failure f;
  f.kind = g.abortKind <= static_cast<uint8_t>(AbortKind::kProtocol)
               ? static_cast<AbortKind>(g.abortKind)
               : AbortKind::kPeer;
  f.origin = g.root == 0 ? -1 : static_cast<int>(g.root - 1);
  f.text = text;
  return f;
}

void throwAbort(const FrameHeader& g, const std::string& text, const LinkContext& c) {
  throwFailure(abortFailure(g, text),
               fmt::format("rank {} ← peer {}: peer {} aborted: {}", c.rank, c.peer, c.peer, text));
}

namespace {
template <typename E>
[[noreturn]] void raise(E error, int origin) {
  error.setOrigin(origin);
  throw error;
}
}  // namespace

void throwFailure(const Failure& f, const std::string& message) {
  switch (f.kind) {
    case AbortKind::kTimeout:
      raise(TimeoutError(message), f.origin);
    case AbortKind::kMismatch:
      raise(MismatchError(message), f.origin);
    case AbortKind::kProtocol:
      raise(ProtocolError(message), f.origin);
    case AbortKind::kPeer:
      break;
  }
  raise(PeerError(message), f.origin);
}

}  // namespace shoal::transport
