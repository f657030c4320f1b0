#include "ps/protocol.h"

#include "comm/compress/half_cast.h"
#include "comm/native/native_engine.h"
#include "common/error.h"

namespace shoal::ps {

using transport::Transfer;

std::string_view toString(RequestKind kind) {
  switch (kind) {
    case RequestKind::kHello:
      return "hello";
    case RequestKind::kInit:
      return "init";
    case RequestKind::kPush:
      return "push";
    case RequestKind::kPull:
      return "pull";
    case RequestKind::kPushPull:
      return "push-pull";
    case RequestKind::kBye:
      return "bye";
  }
  return "unknown";
}

std::string_view toString(Encoding encoding) {
  switch (encoding) {
    case Encoding::kRaw:
      return "raw";
    case Encoding::kFp16:
      return "fp16";
    case Encoding::kBf16:
      return "bf16";
    case Encoding::kTopK:
      return "topk";
    case Encoding::kOneBit:
      return "onebit";
  }
  return "unknown";
}

std::string pairName(int server, int worker) {
  return fmt::format("ps-s{}-w{}", server, worker);
}

std::string backupPairName(int shard, int worker) {
  return fmt::format("ps-b{}-w{}", shard, worker);
}

namespace {

// The engine's error, retold from the worker's point of view (which server, which request).
std::exception_ptr retell(std::exception_ptr error, int server, const Request& rq, int worker) {
  if (!error) return nullptr;
  const auto what = toString(static_cast<RequestKind>(rq.kind));
  const std::string op =
      fmt::format("parameter server {}: {} step {} from worker {}", server, what, rq.step, worker);
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    return std::make_exception_ptr(InvalidArgument(
        fmt::format("parameter server {} refused the {}: {}", server, what, e.what())));
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(TimeoutError(fmt::format("{} timed out: {}", op, e.what())));
  } catch (const PeerError& e) {
    return std::make_exception_ptr(PeerError(fmt::format(
        "{} failed: the server died, was killed or stopped (see its log): {}", op, e.what())));
  } catch (const ProtocolError& e) {
    return std::make_exception_ptr(
        ProtocolError(fmt::format("{}: protocol error: {}", op, e.what())));
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

std::shared_ptr<comm::Work> submitExchange(comm::Group& pair, int server, int worker,
                                           std::shared_ptr<Exchange> x,
                                           std::chrono::nanoseconds timeout) {
  comm::CallOptions call;
  call.timeout = timeout;
  transport::FrameHeader base;
  base.dtype = static_cast<uint8_t>(DataType::kUInt8);
  auto inner = comm::submit(pair, kPsOperation, base, call, [x](comm::OpContext& ctx) {
    std::vector<Transfer> batch{ctx.send(0, 0, &x->request, sizeof(Request))};
    if (x->request.bytes > 0) batch.push_back(ctx.send(0, 1, x->payload, x->request.bytes));
    batch.push_back(ctx.recv(0, 2, &x->reply, sizeof(Reply)));
    ctx.run(batch);
    const Reply& r = x->reply;
    if (r.magic != kReplyMagic) SHOAL_THROW(ProtocolError, "reply magic {:#x}", r.magic);
    const auto status = static_cast<Status>(r.status);
    std::string text;
    if (r.bytes > 0) {
      void* dst = nullptr;
      const bool half = x->request.pullEncoding == static_cast<uint8_t>(Encoding::kFp16);
      if (status == Status::kOk && x->into) {
        if (r.bytes != x->request.pullBytes) {
          SHOAL_THROW(ProtocolError, "the server sent {} bytes of values, expected {}", r.bytes,
                      x->request.pullBytes);
        }
        if (half) x->half.resize(r.bytes / sizeof(uint16_t));
        dst = half ? static_cast<void*>(x->half.data()) : x->into;
      } else {
        if (r.bytes > kMaxErrorText) SHOAL_THROW(ProtocolError, "a {}-byte reply text", r.bytes);
        text.resize(r.bytes);
        dst = text.data();
      }
      std::vector<Transfer> values{ctx.recv(0, 3, dst, r.bytes)};
      ctx.run(values);
      // Decoded here, on this server's executor: the servers' values decode in parallel.
      if (half && dst == x->half.data()) {
        compress::decodeHalf(DataType::kFloat16, x->half.data(), static_cast<float*>(x->into),
                             x->half.size());
      }
    }
    if (r.status > static_cast<uint32_t>(Status::kFailed)) {
      SHOAL_THROW(ProtocolError, "reply status {}", r.status);
    }
    // A refusal is a complete, well-formed exchange: the pair stays in step, so it must not
    // fail the operation (any failure inside one aborts the group). The caller's Work
    // fails with it below, once the operation has completed.
    x->text = std::move(text);
  });
  auto outer = std::make_shared<comm::Work>();
  inner->onDone([outer, x, server, worker](std::exception_ptr e) {
    if (!e) {
      x->answered = true;
      switch (static_cast<Status>(x->reply.status)) {
        case Status::kOk:
          break;
        case Status::kRejected:
          e = std::make_exception_ptr(InvalidArgument(x->text));
          break;
        case Status::kTimeout:
          e = std::make_exception_ptr(TimeoutError(x->text));
          break;
        case Status::kFailed:
          e = std::make_exception_ptr(PeerError(x->text));
          break;
      }
    }
    outer->finish(retell(e, server, x->request, worker));
  });
  return outer;
}

}  // namespace shoal::ps
