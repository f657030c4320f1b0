// A worker's thread on a parameter server: its connection, each request's exchange (the request,
// its payload received straight into the shard, its slot or a buffer, then the reply), and the
// failure that stops the server (ps/server_state.h).
#include <algorithm>
#include <exception>
#include <mutex>
#include <string>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "ps/payload_codec.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

namespace {

// A refused request's payload is read and dropped up to this size; a larger one is not a
// mistake but a broken stream (ProtocolError).
constexpr size_t kMaxDrain = 1ull << 30;

}  // namespace

void applyPiece(void* context, const void* data, size_t offset, size_t bytes) {
  auto& sc = *static_cast<Scratch*>(context);
  sc.shard->applyIncoming(sc.incoming, static_cast<const float*>(data), offset / sizeof(float),
                          bytes / sizeof(float));
  sc.ready = offset + bytes;
}

void Server::serveWorker(int w) {
  try {
    auto pair = world_.connect(pairNameFor(w), 0, 2);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pairs_[w] = pair;
      if (!failure_.empty()) pair->interrupt();
    }
    Scratch scratch;
    comm::CallOptions call;
    call.timeout = opt_.idleTimeout;
    transport::FrameHeader base;
    base.dtype = static_cast<uint8_t>(DataType::kUInt8);
    bool bye = false;
    while (!bye) {
      comm::execute(*pair, kPsOperation, base, call,
                    [&](comm::OpContext& ctx) { bye = handle(ctx, w, scratch); });
    }
  } catch (const ServerFault& e) {
    // The server's own disk (or its own waits) failed, not the worker it was serving.
    fail(w, e.what(), /*serverFault=*/true);
  } catch (const std::exception& e) {
    fail(w, e.what());
  }
}

bool Server::handle(comm::OpContext& ctx, int w, Scratch& sc) {
  Request rq;
  sc.batch.assign(1, ctx.recv(1, 0, &rq, sizeof(Request)));
  ctx.run(sc.batch);
  if (rq.magic != kRequestMagic) {
    SHOAL_THROW(ProtocolError, "worker {} sent request magic {:#x}", w, rq.magic);
  }
  setBusy(w, true);
  sc.apply.reset();
  // However the request ends, a pull's hold on the values ends with it (a push's hold ends
  // only once its update is complete: Note [Shard access] in ps/shard_access.h).
  struct EndRead {
    Server& server;
    Scratch& sc;
    ~EndRead() { server.endRead(sc); }
  } endRead{*this, sc};
  Status status = Status::kOk;
  std::string error;
  auto guarded = [&](auto&& fn) {
    if (status != Status::kOk) return;
    try {
      fn();
    } catch (const InvalidArgument& e) {
      status = Status::kRejected;
      error = e.what();
    } catch (const TimeoutError& e) {
      status = Status::kTimeout;
      error = e.what();
    } catch (const PeerError& e) {
      status = Status::kFailed;
      error = e.what();
    }
  };
  void* dst = nullptr;
  sc.streaming = false;
  guarded([&] { dst = prepare(w, rq, sc); });
  const bool packed = status == Status::kOk && isCompressedPush(rq);
  if (rq.bytes > 0) {
    if (packed) {
      // Decoded once whole (below), then applied as a raw push would be.
      sc.packed.resize(rq.bytes);
      sc.batch.assign(1, ctx.recv(1, 1, sc.packed.data(), rq.bytes));
    } else if (sc.writing) {
      // Note [Update from the ring]: no copy into the slot, no second pass over it.
      sc.batch.assign(1, ctx.recvApply(1, 1, rq.bytes, {&applyPiece, &sc, sizeof(float)}));
      if (sc.streaming) {
        sc.ready = 0;
        sc.batch.push_back(ctx.send(1, 2, &sc.reply, sizeof(Reply)));
        sc.batch.push_back(ctx.sendAsReady(1, 3, sc.values, sc.reply.bytes, &sc.ready));
      }
    } else {
      if (!dst) {
        if (rq.bytes > kMaxDrain) {
          SHOAL_THROW(ProtocolError, "worker {} sent a {}-byte payload", w, rq.bytes);
        }
        sc.drain.resize(rq.bytes);
        dst = sc.drain.data();
      }
      sc.batch.assign(1, ctx.recv(1, 1, dst, rq.bytes));
    }
    ctx.run(sc.batch);
  }
  if (packed) guarded([&] { unpack(rq, sc, static_cast<float*>(dst)); });
  if (sc.streaming) {
    completeStreamed(w, rq, sc);
    setBusy(w, false);
    return false;
  }
  Reply rp;
  const void* out = nullptr;
  size_t outBytes = 0;
  guarded([&] { complete(w, rq, sc, rp, out, outBytes); });
  if (status == Status::kOk && sc.reading) {
    // fp16 values are encoded outside the lock; the read hold keeps the values still.
    out =
        encodePull(rq, static_cast<const float*>(out), outBytes / sizeof(float), sc.half, outBytes);
  }
  if (status != Status::kOk) {
    if (status == Status::kRejected) {
      std::lock_guard<std::mutex> lock(mu_);
      ++report_.refused;
    }
    error = fmt::format("worker {}: {} step {}: {}", w, toString(static_cast<RequestKind>(rq.kind)),
                        rq.step, error);
    error.resize(std::min(error.size(), kMaxErrorText));
    rp = Reply{};
    rp.status = static_cast<uint32_t>(status);
    out = error.data();
    outBytes = error.size();
  }
  rp.bytes = outBytes;
  sc.batch.assign(1, ctx.send(1, 2, &rp, sizeof(Reply)));
  if (outBytes > 0) sc.batch.push_back(ctx.send(1, 3, out, outBytes));
  ctx.run(sc.batch);
  setBusy(w, false);
  return status == Status::kOk && static_cast<RequestKind>(rq.kind) == RequestKind::kBye;
}

// ---- failure

void Server::setBusy(int w, bool busy) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_[w] = busy;
}

void Server::fail(int w, const std::string& what, bool serverFault) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) return;
  failure_ = serverFault ? fmt::format("{} stopped: {}", name_, what)
                         : fmt::format("{} stopped: worker {} failed: {}", name_, w, what);
  cv_.notify_all();
  // Workers waiting in a request get the reason in their reply; idle connections are closed
  // so that their threads stop waiting for requests that will not come.
  for (int p = 0; p < workers_; ++p) {
    if (p != w && pairs_[p] && !busy_[p] && !done_[p]) pairs_[p]->interrupt();
  }
}

}  // namespace shoal::ps::detail
