// The parameter-server wire protocol: one request and one reply per operation, over the engine
// (each (server, worker) pair is a two-rank group: server rank 0, worker rank 1), so every
// message travels in checked Shoal frames on shared memory or TCP, authenticated.
//
// An operation is four frames of one kPsOperation op: request header (step 0), its payload
// (step 1, may be empty), reply header (step 2), reply payload (step 3: values on a pull, the
// error text on a refusal). The receiver of a payload knows its size from the header before it.
// A refused request costs its payload (the server drains it) and nothing else: the pair stays in
// step and the server keeps serving.
//
// The reply may start before the request's payload has all arrived: a push-pull the server can
// answer up front gets its reply header at once and the values piece by piece as the push is
// applied (Note [Streamed push-pull] in ps/server_stream.cpp). The server keeps reading the payload
// while it waits for room to send, so a worker may send the whole payload before it reads
// anything (submitExchange sends it and receives the reply header in one batch).
//
// Encodings (ps/payload_codec.h): a push names the encoding of its payload (Request::encoding:
// raw float32, fp16, bf16, top-k or 1-bit; per piece, see there), and a pull the encoding it
// wants the values in (Request::pullEncoding: raw or fp16). The server checks the request's
// version, both ids and the payload's exact size for the pieces it covers before it waits for
// or touches anything, decodes a compressed push into float32 and then applies it as it would a
// raw one; anything wrong is refused (InvalidArgument on the worker, one line). Every request
// carries kProtocolVersion: a server refuses another one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/group.h"
#include "comm/work.h"

namespace shoal::ps {

// The operation code of parameter-server frames (comm leaves codes from kFirstExternal up to the
// layers above it).
inline constexpr transport::OpCode kPsOperation = comm::op::kFirstExternal;

inline constexpr uint32_t kRequestMagic = 0x51525350;  // "PSRQ"
inline constexpr uint32_t kReplyMagic = 0x50525350;    // "PSRP"
inline constexpr int kMaxDims = 8;
inline constexpr int32_t kAllKeys = -1;  // the request covers every piece the server holds
inline constexpr size_t kMaxErrorText = 64 << 10;
// 1: raw float32 payloads only (the encoding byte reserved). 2: encodings, this version field.
inline constexpr uint32_t kProtocolVersion = 2;

enum class RequestKind : uint32_t {
  kHello = 1,     // payload: training settings, a blank line, the keys (Partition::keysText)
  kInit = 2,      // payload: initial values of the whole shard (worker 0 on a fresh start)
  kPush = 3,      // payload: gradients (parameters) and values (state keys) for `step`
  kPull = 4,      // no payload; reply: values for computing `step`
  kPushPull = 5,  // push for `step`, then pull for step + 1, in one round trip
  kBye = 6,       // the worker is done
};
std::string_view toString(RequestKind kind);

enum class Status : uint32_t {
  kOk = 0,
  kRejected = 1,  // bad request (shape, dtype, key, step): InvalidArgument on the worker
  kTimeout = 2,   // the server waited too long for other workers: TimeoutError
  kFailed = 3,    // the server failed (another worker died): PeerError
};

// How a push's payload or a pull's values travel (Note [Payload layout] in ps/payload_codec.h).
enum class Encoding : uint8_t {
  kRaw = 0,    // float32
  kFp16 = 1,   // IEEE half (pushes and pulls)
  kBf16 = 2,   // bfloat16 (pushes)
  kTopK = 3,   // (index, value) pairs of the largest gradients, Request::density of each piece
  kOneBit = 4  // a scale and one sign bit per gradient element
};
std::string_view toString(Encoding encoding);

#pragma pack(push, 1)
struct Request {
  uint32_t magic = kRequestMagic;
  uint32_t kind = 0;
  int32_t key = kAllKeys;
  uint8_t dtype = 0;
  uint8_t ndim = 0;
  uint8_t encoding = 0;      // Encoding of the payload (a push's; raw for every other kind)
  uint8_t pullEncoding = 0;  // Encoding of the values a pull wants back (raw or fp16)
  int64_t shape[kMaxDims] = {};
  uint64_t step = 0;
  uint64_t bytes = 0;      // payload after the header
  uint64_t pullBytes = 0;  // pull / push-pull: the bytes the worker expects back
  uint32_t version = kProtocolVersion;
  uint32_t flags = 0;  // kSoleCopy (ps/replacement.h); 0 otherwise
  double density = 0;  // kTopK: the fraction of each piece's elements sent (0, 1]
};

struct Reply {
  uint32_t magic = kReplyMagic;
  uint32_t status = 0;
  uint64_t step = 0;     // hello: the step to resume from; pull: the step the values are for
  uint64_t slowest = 0;  // pull: the slowest worker's clock (steps pushed) when released
  uint64_t version = 0;  // updates applied to the shard so far
  uint64_t flags = 0;    // hello: kNeedsInit
  uint64_t bytes = 0;    // payload after the header
};
#pragma pack(pop)

inline constexpr uint64_t kNeedsInit = 1;

// The name of the pair group between server s and worker w.
std::string pairName(int server, int worker);
// The name of the pair group between the backup of shard s (Note [Replicated shards] in
// ps/server.h: hosted by server (s + 1) % servers) and worker w.
std::string backupPairName(int shard, int worker);

// One exchange from the worker's side. `payload` and `into` belong to the exchange until its
// Work finishes. `into` receives the values: request.pullBytes of them, or with pullEncoding
// kFp16 the float32 values decoded from the request.pullBytes / 2 fp16 ones the server sent.
struct Exchange {
  Request request;
  const void* payload = nullptr;
  void* into = nullptr;
  Reply reply;
  std::string text;  // the reply text: a kOk hello's payload, or why the server refused
  // The server replied (whatever the status): the exchange failed, if it did, because the
  // server said so, not because the server was lost.
  bool answered = false;
  std::vector<uint8_t> packed;  // a compressed push's payload, when `payload` points here
  std::vector<uint16_t> half;   // an fp16 pull's values as they arrived
};

// Runs the exchange on the pair group's executor. The Work fails with InvalidArgument (refused),
// TimeoutError or PeerError (server gone or failed), each message naming the server.
std::shared_ptr<comm::Work> submitExchange(comm::Group& pair, int server, int worker,
                                           std::shared_ptr<Exchange> x,
                                           std::chrono::nanoseconds timeout);

}  // namespace shoal::ps
