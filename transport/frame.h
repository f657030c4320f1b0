// The header every message carries, and the checks a receiver makes before trusting a byte.
//
// A receiver always knows what it expects next from a peer (collectives are issued in the same
// order on every rank), so it compares the arriving header field by field:
// - magic/version/group wrong, or a payload size other than expected: ProtocolError (the bytes
//   are not ours, are corrupt, or the stream is out of step); the payload is never read.
// - another operation, sequence number, count, dtype, reduce op, root or algorithm:
//   MismatchError naming both sides ("rank 1 has allreduce #5 of 77 x float32, peer 3 sent
//   allreduce #5 of 100 x float32").
// - an abort frame: the peer failed; its message travels in the payload (at most kMaxAbortText).
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"

namespace shoal::transport {

inline constexpr uint32_t kFrameMagic = 0x4c4f4853;  // "SHOL" little-endian
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr uint32_t kMaxAbortText = 4096;

// kGoodbye: the peer destroyed its end of the group normally; end-of-file after it is benign.
enum class FrameKind : uint8_t { kData = 1, kAbort = 2, kGoodbye = 3 };

// What a frame belongs to: a code defined by the layer that runs the operation (comm/op_code.h
// for the collectives, point-to-point and group bookkeeping; ps/protocol.h for the parameter
// server). Transport only compares codes and never interprets them, so a new kind of operation
// edits no file here. Make one with OpCode{n}.
enum class OpCode : uint8_t { kNone = 0 };

// How an abort frame's error should be re-thrown on the receiving rank.
enum class AbortKind : uint8_t { kPeer = 0, kTimeout = 1, kMismatch = 2, kProtocol = 3 };

// Why a group failed, as it travels between ranks: in abort frames (kind in abortKind, origin in
// root, text as payload) and in the store's abort records. `origin` is the group rank where the
// failure started (-1: unknown); `text` is that rank's description of it, forwarded unchanged by
// every rank that fails because of it.
struct Failure {
  AbortKind kind = AbortKind::kPeer;
  int origin = -1;
  std::string text;
};

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t version = kProtocolVersion;
  uint8_t kind = static_cast<uint8_t>(FrameKind::kData);
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t redop = 0;
  uint8_t algo = 0;
  uint8_t abortKind = 0;
  uint8_t reserved = 0;
  uint32_t group = 0;
  uint32_t root = 0;  // abort frames: the Failure's origin + 1 (0: unknown)
  uint32_t step = 0;
  uint64_t seq = 0;
  uint64_t count = 0;  // elements in the whole collective (not this frame), for mismatch checks
  uint64_t bytes = 0;  // payload bytes that follow this header
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 48, "frame header is 48 bytes on the wire");

// Names a frame for error messages ("allreduce #5 of 77 x float32 (sum)"). The layer that
// defines the operation codes supplies it (EndpointOptions::describe); describeFrame is the
// generic one ("operation 1 #5 of 77 x float32").
using FrameDescriber = std::string (*)(const FrameHeader&);
std::string describeFrame(const FrameHeader& h);

// Who is checking: used in error messages ("rank 1 ← peer 3").
struct LinkContext {
  int rank = 0;
  int peer = 0;
};

// Throws the right error if `got` is not the frame `expected` (see the file comment). An abort
// frame is not checked here: the caller reads its text and calls throwAbort.
void checkFrame(const FrameHeader& expected, const FrameHeader& got, const LinkContext& ctx,
                FrameDescriber describe = describeFrame);

// Throws what an abort frame announces ("rank r ← peer p: peer p aborted: text").
[[noreturn]] void throwAbort(const FrameHeader& got, const std::string& text,
                             const LinkContext& ctx);

// The Failure an abort frame announces.
Failure abortFailure(const FrameHeader& got, const std::string& text);

// Throws the error type `failure.kind` stands for, with `message`, origin set.
[[noreturn]] void throwFailure(const Failure& failure, const std::string& message);

}  // namespace shoal::transport
