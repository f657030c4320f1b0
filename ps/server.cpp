#include "ps/server.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "ps/partition.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"
#include "ps/shard.h"
#include "ps/shard_access.h"
#include "ps/shard_restore.h"
#include "ps/trace_spans.h"

namespace shoal::ps {

namespace {

// A failure of the server itself, never of the worker it was serving when it happened.
class ServerFault : public Error {
 public:
  using Error::Error;
};

// A checkpoint the server could not write.
class CheckpointWriteError : public ServerFault {
 public:
  using ServerFault::ServerFault;
};

}  // namespace

namespace {

using transport::Transfer;

constexpr size_t kMaxHello = 16 << 20;
// A refused request's payload is read and dropped up to this size; a larger one is not a
// mistake but a broken stream (ProtocolError).
constexpr size_t kMaxDrain = 1ull << 30;

// The pieces [first, last) a request covers, and their place in the shard.
struct Target {
  size_t first = 0, last = 0;
  size_t offset = 0;  // local element offset
  size_t count = 0;   // elements
};

// Per worker thread buffers, reused from request to request.
struct Scratch {
  std::vector<Transfer> batch;
  std::string text;
  std::vector<uint8_t> drain;
  // What this request holds of the shard (Note [Shard access] in ps/shard_access.h).
  bool writing = false;  // a push applied as it arrives, planned in `incoming`
  bool reading = false;  // a pull reply sent straight from the values
  Shard* shard = nullptr;
  Shard::Incoming incoming;
  // Note [Streamed push-pull]: the reply, decided before the push is applied, and its values
  // going out as they are updated (`ready` bytes of them so far).
  bool streaming = false;
  Reply reply;
  const float* values = nullptr;
  size_t ready = 0;
  // A compressed push (ps/payload_codec.h): what it covers, its payload and its float32
  // decoding; an fp16 pull's values.
  Target target;
  std::vector<uint8_t> packed;
  std::vector<float> decoded;
  std::vector<uint16_t> half;
  // The span of an update applied as it arrives (ps/trace_spans.h), from its first byte on.
  std::optional<TraceSpan> apply;
};

// The receive-apply kernel (transport::PieceHandler; context: the worker's Scratch): a piece
// of a push, straight from the receive ring, applied to the shard. A streamed reply may then
// send the values of this piece (the payload and the values cover the same elements).
void applyPiece(void* context, const void* data, size_t offset, size_t bytes) {
  auto& sc = *static_cast<Scratch*>(context);
  sc.shard->applyIncoming(sc.incoming, static_cast<const float*>(data), offset / sizeof(float),
                          bytes / sizeof(float));
  sc.ready = offset + bytes;
}

class Server {
 public:
  // `backup`: this is the backup of shard `id`, hosted by server (id + 1) % servers (Note
  // [Replicated shards] in ps/server.h): its own connections, no checkpoints.
  Server(comm::Group& world, int id, int servers, int workers, const ServerOptions& o,
         bool backup = false)
      : world_(world),
        id_(id),
        servers_(servers),
        workers_(workers),
        opt_(o),
        backup_(backup),
        sink_(world.options().trace.get()),
        name_(backup
                  ? fmt::format("parameter server {} (backup of shard {})", (id + 1) % servers, id)
                  : fmt::format("parameter server {}", id)),
        clocks_(static_cast<size_t>(workers), 0),
        done_(static_cast<size_t>(workers), 0),
        busy_(static_cast<size_t>(workers), 0),
        pairs_(static_cast<size_t>(workers)) {
    SHOAL_CHECK(servers >= 1 && id >= 0 && id < servers, "server {} of {}", id, servers);
    SHOAL_CHECK(workers >= 1, "parameter server {}: {} workers", id, workers);
    if (!opt_.checkpointDir.empty() && !backup_) {
      series_ = std::make_unique<SealedSeries>(shardCheckpointFolder(opt_.checkpointDir, id),
                                               "shard-", ".bin", opt_.keep);
    }
  }

  ServerReport run() {
    if (opt_.resume && series_) restore();
    std::vector<std::thread> threads;
    for (int w = 0; w < workers_; ++w) threads.emplace_back([this, w] { serveWorker(w); });
    for (auto& t : threads) t.join();
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.empty()) throw PeerError(failure_);
    report_.finalStep = minClock();
    if (series_ && configured_) writeCheckpoint(checkpointRound());
    return report_;
  }

 private:
  // ---- one thread per worker

  void serveWorker(int w) {
    try {
      auto pair = world_.connect(backup_ ? backupPairName(id_, w) : pairName(id_, w), 0, 2);
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

  bool handle(comm::OpContext& ctx, int w, Scratch& sc) {
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
      out = encodePull(rq, static_cast<const float*>(out), outBytes / sizeof(float), sc.half,
                       outBytes);
    }
    if (status != Status::kOk) {
      if (status == Status::kRejected) {
        std::lock_guard<std::mutex> lock(mu_);
        ++report_.refused;
      }
      error = fmt::format("worker {}: {} step {}: {}", w,
                          toString(static_cast<RequestKind>(rq.kind)), rq.step, error);
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

  // Where the request's payload goes (null: it has none, or the request is refused and the
  // payload is drained). Throws to refuse.
  void* prepare(int w, const Request& rq, Scratch& sc) {
    const auto kind = static_cast<RequestKind>(rq.kind);
    std::unique_lock<std::mutex> lock(mu_);
    throwIfFailed();
    checkEncodings(rq);
    switch (kind) {
      case RequestKind::kHello:
        if (rq.bytes > kMaxHello) {
          SHOAL_THROW(InvalidArgument, "a {}-byte hello (the model description is too large)",
                      rq.bytes);
        }
        sc.text.resize(rq.bytes);
        return sc.text.data();
      case RequestKind::kInit:
        requireConfigured();
        if (w != 0 || initialized_) {
          SHOAL_THROW(InvalidArgument, "only worker 0 initializes, once (the shard is {})",
                      initialized_ ? "already initialized" : "waiting for worker 0");
        }
        expectBytes(rq.bytes, shard_->elements() * sizeof(float), "initial values");
        return shard_->values();
      case RequestKind::kPush:
      case RequestKind::kPushPull: {
        requireConfigured();
        waitInitialized(lock);
        Target t = target(rq);
        checkPushBytes(rq, piecesOf(t), partition_->keys());
        sc.target = t;
        const bool sync = config_.mode == Mode::kSync;
        if (sync) waitForStep(lock, w, t, rq.step);
        // Note [Update from the ring]: applied as it arrives unless it must wait in its slot
        // for other workers' contributions to the same step.
        if (!sync || shard_->completesStep(w, t.first, t.last)) {
          beginWrite(lock);
          // Still so after the wait: in synchronous mode nobody else can move these pieces.
          if (!sync || shard_->completesStep(w, t.first, t.last)) {
            shard_->beginIncoming(w, t.first, t.last, static_cast<int64_t>(rq.step), sc.incoming);
            sc.shard = shard_.get();
            sc.writing = true;
            sc.apply = beginApplySpan(sink_);
            if (kind == RequestKind::kPushPull) maybeStream(w, rq, t, sc);
            return nullptr;
          }
          endWrite(sc);
        }
        return shard_->slot(w) + t.offset;
      }
      case RequestKind::kPull:
        requireConfigured();
        expectBytes(rq.bytes, 0, "a pull");
        return nullptr;
      case RequestKind::kBye:
        return nullptr;
    }
    SHOAL_THROW(InvalidArgument, "unknown request kind {}", rq.kind);
  }

  void complete(int w, const Request& rq, Scratch& sc, Reply& rp, const void*& out,
                size_t& outBytes) {
    const auto kind = static_cast<RequestKind>(rq.kind);
    std::unique_lock<std::mutex> lock(mu_);
    throwIfFailed();
    switch (kind) {
      case RequestKind::kHello:
        hello(w, sc.text, rp);
        return;
      case RequestKind::kInit:
        initialized_ = true;
        cv_.notify_all();
        return;
      case RequestKind::kPush:
        push(lock, w, rq, sc);
        return;
      case RequestKind::kPushPull:
        push(lock, w, rq, sc);
        pull(lock, w, rq, rq.step + 1, sc, rp, out, outBytes);
        return;
      case RequestKind::kPull:
        pull(lock, w, rq, rq.step, sc, rp, out, outBytes);
        return;
      case RequestKind::kBye:
        done_[w] = 1;
        cv_.notify_all();
        return;
    }
  }

  void hello(int w, const std::string& text, Reply& rp) {
    const auto nl = text.find('\n');
    if (nl == std::string::npos) SHOAL_THROW(InvalidArgument, "malformed hello");
    const std::string configText = text.substr(0, nl);
    TrainingConfig config;
    std::vector<KeySpec> keys;
    try {
      config = TrainingConfig::parse(configText);
      keys = Partition::parseKeys(std::string_view(text).substr(nl + 1));
    } catch (const ProtocolError& e) {
      SHOAL_THROW(InvalidArgument, "malformed hello: {}", e.what());
    }
    if (!configured_) {
      partition_ = std::make_unique<Partition>(std::move(keys), servers_);
      config_ = config;
      configText_ = configText;
      shard_ = std::make_unique<Shard>(*partition_, id_, workers_, config_);
      configured_ = true;
      report_.partition = partition_->describe();
      if (!opt_.quiet) {
        fmt::print(
            "{} of {}: {} mode{}, {} workers, {} (lr {}); holds {:.1f} KB\n", name_, servers_,
            toString(config_.mode),
            config_.mode == Mode::kSsp ? fmt::format(" (staleness {})", config_.staleness) : "",
            workers_, toString(config_.optimizer.kind), config_.optimizer.lr,
            static_cast<double>(shard_->elements() * sizeof(float)) / 1e3);
        std::fflush(stdout);
      }
      cv_.notify_all();
    } else {
      const std::string origin =
          restored_ ? "the checkpoint this server resumed from" : "the first worker's";
      if (auto d = partition_->firstDifference(keys); !d.empty()) {
        SHOAL_THROW(InvalidArgument, "worker {}'s model differs from {}: {}", w, origin, d);
      }
      if (configText != configText_) {
        SHOAL_THROW(InvalidArgument, "worker {}'s training settings '{}' differ from {}: '{}'", w,
                    configText, origin, configText_);
      }
    }
    rp.step = resumeStep_;
    rp.flags = (w == 0 && !initialized_) ? kNeedsInit : 0;
  }

  void push(std::unique_lock<std::mutex>& lock, int w, const Request& rq, Scratch& sc) {
    Target t = target(rq);
    SHOAL_ASSERT(sc.writing || config_.mode == Mode::kSync, "worker {}: an {} push in its slot", w,
                 toString(config_.mode));
    if (sc.writing) {
      // Applied while it arrived: only the versions move on now.
      shard_->endIncoming(sc.incoming);
      endWrite(sc);
      ++report_.appliedOnArrival;
      traceApply(sc.apply, w, rq, t, /*fromSlots=*/false);
    } else if (shard_->completesAnyStep(w, t.first, t.last)) {
      // From the slot, completing pieces other workers were waiting on (a push that completes
      // only some of its pieces: keyed pushes mixed with whole ones).
      beginWrite(lock);
      std::optional<TraceSpan> span = beginApplySpan(sink_);
      shard_->arrive(w, t.first, t.last);
      endWrite(sc);
      traceApply(span, w, rq, t, /*fromSlots=*/true);
    } else {
      shard_->arrive(w, t.first, t.last);  // waits in its slot for the others
    }
    clocks_[w] = std::max<uint64_t>(clocks_[w], rq.step + 1);
    ++report_.pushes;
    cv_.notify_all();
    maybeCheckpoint(lock);
  }

  // Records an update's span (ps/trace_spans.h), if begun; before the pusher's clock moves on.
  void traceApply(std::optional<TraceSpan>& span, int w, const Request& rq, const Target& t,
                  bool fromSlots) {
    if (!span) return;
    AppliedUpdate u;
    u.worker = w;
    u.step = rq.step;
    if (rq.key != kAllKeys) u.key = &partition_->keys()[static_cast<size_t>(rq.key)].name;
    u.elements = t.count;
    u.version = minVersion(t);
    u.contributions = config_.mode == Mode::kSync ? workers_ : 1;
    u.lead = static_cast<int64_t>(rq.step) - static_cast<int64_t>(minClock());
    u.fromSlots = fromSlots;
    endApplySpan(*sink_, std::move(*span), u);
    span.reset();
  }

  void pull(std::unique_lock<std::mutex>& lock, int w, const Request& rq, uint64_t step,
            Scratch& sc, Reply& rp, const void*& out, size_t& outBytes) {
    waitInitialized(lock);
    Target t = target(rq);
    checkPullBytes(rq, t.count);
    if (config_.mode == Mode::kSync) {
      waitUntil(
          lock, [&] { return minVersion(t) >= step; },
          [&] { return fmt::format("pull for step {}: {}", step, missing(t)); });
    } else if (config_.mode == Mode::kSsp) {
      waitUntil(
          lock, [&] { return minClock() + static_cast<uint64_t>(config_.staleness) >= step; },
          [&] {
            return fmt::format("pull for step {} (staleness {}): the slowest worker is at step {}",
                               step, config_.staleness, minClock());
          });
    }
    // The reply is sent straight from the values: no update may start until it is out.
    beginRead(lock, sc);
    const uint64_t slowest = minClock();
    report_.maxLead = std::max<int64_t>(report_.maxLead,
                                        static_cast<int64_t>(step) - static_cast<int64_t>(slowest));
    ++report_.pulls;
    rp.step = step;
    rp.slowest = slowest;
    rp.version = minVersion(t);
    out = shard_->values() + t.offset;
    outBytes = t.count * sizeof(float);
  }

  // ---- Note [Streamed push-pull]
  //
  // A push-pull whose push is applied as it arrives (Note [Update from the ring]) and whose pull
  // could then be answered at once (synchronous: the push completes the step; asynchronous;
  // SSP within the bound) does not wait for the whole payload before replying: the reply
  // header goes first, decided now, and each piece of the values follows as soon as the same
  // piece of the push was applied (transport::Transfer::sendAsReady), so the update and the
  // reply overlap, and so do the worker's copy of the gradients into the ring and its copy of
  // the values out. The write hold covers the whole exchange, so the values sent are exactly
  // those after this push, as pull() would send them. The reply's numbers are those pull()
  // would give right after push(); a worker saying goodbye meanwhile can make `slowest`
  // one step older than that. A failure of the server after the header went out reaches the
  // worker with its next request.

  void maybeStream(int w, const Request& rq, const Target& t, Scratch& sc) {
    if (t.count == 0 || rq.pullBytes != t.count * sizeof(float)) return;  // pull() refuses
    // Only a raw push arrives piece by piece, and only raw values go out as they are updated.
    if (rq.encoding != 0 || rq.pullEncoding != 0) return;
    const uint64_t step = rq.step + 1;
    const uint64_t slowest = minClock(w, step);
    if (config_.mode == Mode::kSsp && slowest + static_cast<uint64_t>(config_.staleness) < step) {
      return;  // the pull must wait for slower workers
    }
    sc.reply = Reply{};
    sc.reply.step = step;
    sc.reply.slowest = slowest;
    sc.reply.version = minVersion(t) + 1;  // every piece of t moves on with this push
    sc.reply.bytes = t.count * sizeof(float);
    sc.values = shard_->values() + t.offset;
    sc.streaming = true;
  }

  void completeStreamed(int w, const Request& rq, Scratch& sc) {
    std::unique_lock<std::mutex> lock(mu_);
    throwIfFailed();
    try {
      push(lock, w, rq, sc);
    } catch (const ServerFault&) {
      throw;
    } catch (const Error& e) {
      // The worker already has its reply: what went wrong here is the server's to report.
      throw ServerFault(fmt::format("{}: after worker {}'s push-pull of step {}: {}", name_, w,
                                    rq.step, e.what()));
    }
    ++report_.pulls;
    ++report_.streamed;
    report_.maxLead =
        std::max<int64_t>(report_.maxLead, static_cast<int64_t>(sc.reply.step) -
                                               static_cast<int64_t>(sc.reply.slowest));
  }

  // ---- holds on the shard (Note [Shard access] in ps/shard_access.h)

  void beginWrite(std::unique_lock<std::mutex>& lock) {
    access_.queueWriter();
    try {
      waitUntil(
          lock, [&] { return access_.canWrite(); },
          [&] {
            return fmt::format(
                "an update waited for {} to finish",
                access_.writerActive() ? "another update" : "pull replies being sent");
          });
    } catch (...) {
      access_.withdrawWriter();
      cv_.notify_all();
      throw;
    }
    access_.beginWrite();
  }

  void endWrite(Scratch& sc) {
    access_.endWrite();
    sc.writing = false;
    cv_.notify_all();
  }

  void beginRead(std::unique_lock<std::mutex>& lock, Scratch& sc) {
    waitUntil(
        lock, [&] { return access_.canRead(); },
        [] { return std::string("a pull waited for an update to finish"); });
    access_.beginRead();
    sc.reading = true;
  }

  void endRead(Scratch& sc) {
    if (!sc.reading) return;
    std::lock_guard<std::mutex> lock(mu_);
    access_.endRead();
    sc.reading = false;
    cv_.notify_all();
  }

  // ---- request checks

  Target target(const Request& rq) const {
    Target t;
    if (rq.key == kAllKeys) {
      if (rq.dtype != static_cast<uint8_t>(DataType::kFloat32)) {
        SHOAL_THROW(InvalidArgument, "the whole shard is float32, not {}",
                    toString(static_cast<DataType>(rq.dtype)));
      }
      t.first = 0;
      t.last = shard_->pieceCount();
      t.count = shard_->elements();
      return t;
    }
    const auto& keys = partition_->keys();
    if (rq.key < 0 || static_cast<size_t>(rq.key) >= keys.size()) {
      SHOAL_THROW(InvalidArgument, "no key {} (the model has {})", rq.key, keys.size());
    }
    const KeySpec& k = keys[rq.key];
    std::vector<int64_t> shape(rq.shape, rq.shape + std::min<int>(rq.ndim, kMaxDims));
    if (rq.dtype != static_cast<uint8_t>(k.dtype) || shape != k.shape) {
      SHOAL_THROW(InvalidArgument, "key '{}' is {}; got {}", k.name,
                  describeTensor(k.dtype, k.shape),
                  describeTensor(static_cast<DataType>(rq.dtype), shape));
    }
    for (size_t i = 0; i < shard_->pieceCount(); ++i) {
      if (shard_->piece(i).key == rq.key) {
        t.first = i;
        t.last = i + 1;
        t.offset = shard_->localOffset(i);
        t.count = shard_->piece(i).count;
        return t;
      }
    }
    SHOAL_THROW(InvalidArgument, "key '{}' is not held by server {}", k.name, id_);
  }

  static void expectBytes(uint64_t got, uint64_t expected, const char* what) {
    if (got != expected) {
      SHOAL_THROW(InvalidArgument, "{} carries {} bytes, expected {}", what, got, expected);
    }
  }

  std::span<const Piece> piecesOf(const Target& t) const {
    return std::span(partition_->pieces(id_)).subspan(t.first, t.last - t.first);
  }

  // A compressed push, received whole: decoded, then applied as it would have arrived (the
  // write hold taken in prepare()) or left in the worker's slot. A message the codec refuses
  // is refused before anything changed: the hold is given back untouched.
  void unpack(const Request& rq, Scratch& sc, float* slot) {
    const Target& t = sc.target;
    sc.decoded.resize(t.count);
    try {
      decodePush(static_cast<Encoding>(rq.encoding), rq.density, piecesOf(t), partition_->keys(),
                 sc.packed.data(), sc.decoded.data());
    } catch (const InvalidArgument&) {
      if (sc.writing) {
        std::lock_guard<std::mutex> lock(mu_);
        endWrite(sc);
      }
      sc.apply.reset();  // nothing was applied
      throw;
    }
    if (sc.writing) {
      applyPiece(&sc, sc.decoded.data(), 0, t.count * sizeof(float));
    } else {
      std::copy(sc.decoded.begin(), sc.decoded.end(), slot);
    }
  }

  void requireConfigured() const {
    if (!configured_) SHOAL_THROW(InvalidArgument, "request before the worker's hello");
  }

  void throwIfFailed() const {
    if (!failure_.empty()) throw PeerError(failure_);
  }

  // ---- waiting (bounded by the world's timeout; a failure elsewhere ends every wait)

  template <typename Pred, typename What>
  void waitUntil(std::unique_lock<std::mutex>& lock, Pred pred, What what) {
    const auto timeout = world_.options().timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      throwIfFailed();
      if (pred()) return;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        throwIfFailed();
        if (pred()) return;
        SHOAL_THROW(TimeoutError, "{}: {} (waited {:.0f} s)", name_, what(),
                    std::chrono::duration<double>(timeout).count());
      }
    }
  }

  void waitInitialized(std::unique_lock<std::mutex>& lock) {
    waitUntil(
        lock, [&] { return initialized_; },
        [] { return std::string("worker 0 has not sent the initial values"); });
  }

  void waitForStep(std::unique_lock<std::mutex>& lock, int w, const Target& t, uint64_t step) {
    for (size_t i = t.first; i < t.last; ++i) {
      if (shard_->version(i) > step) {
        SHOAL_THROW(InvalidArgument, "step {} was already applied (the shard is at step {})", step,
                    shard_->version(i));
      }
      if (shard_->version(i) == step && shard_->hasArrived(i, w)) {
        SHOAL_THROW(InvalidArgument, "step {} was already pushed by this worker", step);
      }
    }
    // A worker may push the next step before the others finished this one: it waits here
    // (its slot still holds the current step's contribution).
    waitUntil(
        lock, [&] { return minVersion(t) >= step; },
        [&] { return fmt::format("push of step {}: {}", step, missing(t)); });
  }

  uint64_t minVersion(const Target& t) const {
    uint64_t v = UINT64_MAX;
    for (size_t i = t.first; i < t.last; ++i) v = std::min(v, shard_->version(i));
    return v == UINT64_MAX ? minClock() : v;
  }

  std::string missing(const Target& t) const {
    if (t.first == t.last) return "waiting";
    std::vector<int> absent;
    for (int w = 0; w < workers_; ++w) {
      if (!shard_->hasArrived(t.first, w)) absent.push_back(w);
    }
    return fmt::format("step {} still waits for worker(s) {}", shard_->version(t.first),
                       fmt::join(absent, ", "));
  }

  // The slowest running worker's clock (steps pushed); finished workers do not hold others.
  // With `pusher`: as it will be once that worker's clock is at least `clock`.
  uint64_t minClock(int pusher = -1, uint64_t clock = 0) const {
    uint64_t m = UINT64_MAX, all = 0;
    for (int w = 0; w < workers_; ++w) {
      const uint64_t c = w == pusher ? std::max(clocks_[w], clock) : clocks_[w];
      all = std::max(all, c);
      if (!done_[w]) m = std::min(m, c);
    }
    return m == UINT64_MAX ? all : m;
  }

  // ---- checkpoints

  uint64_t checkpointRound() const {
    if (config_.mode == Mode::kSync && shard_->pieceCount() > 0) {
      return minVersion({0, shard_->pieceCount(), 0, shard_->elements()});
    }
    return minClock();
  }

  void maybeCheckpoint(std::unique_lock<std::mutex>& lock) {
    if (!series_ || opt_.checkpointEvery <= 0) return;
    const auto every = static_cast<uint64_t>(opt_.checkpointEvery);
    auto due = [&] { return checkpointRound() / every > lastCheckpoint_ / every; };
    if (!due()) return;
    // An update being applied elsewhere would be half in the snapshot (Note [Shard access] in
    // ps/shard_access.h).
    waitUntil(
        lock, [&] { return !access_.writerActive(); },
        [] { return std::string("a checkpoint waited for an update to finish"); });
    if (due()) writeCheckpoint(checkpointRound());
  }

  void writeCheckpoint(uint64_t round) {
    // Every worker resumes from `round`: in synchronous mode the contributions already pushed
    // for the next step are not saved (they are pushed again).
    std::vector<uint64_t> clocks(static_cast<size_t>(workers_), round);
    // Note [Resharding checkpoints]: the writer and its job's server count, before the keys.
    const std::string header =
        shardCheckpointHeader(configText_, id_, servers_, partition_->keysText());
    try {
      report_.lastCheckpoint =
          series_->write(static_cast<int64_t>(round), shard_->snapshot(header, round, clocks));
    } catch (const std::exception& e) {
      throw CheckpointWriteError(
          fmt::format("parameter server {}: writing the checkpoint of step {} failed: {}", id_,
                      round, e.what()));
    }
    lastCheckpoint_ = round;
  }

  // Note [Resharding checkpoints] in ps/shard_restore.cpp. A failure throws InvalidArgument on
  // the servers that read the file; the job fails as on any other server error.
  void restore() {
    auto group = world_.connect("ps-servers", id_, servers_);
    auto r = restoreShard(*group, workers_, opt_.checkpointDir, opt_.keep);
    if (!r) return;  // a fresh job
    configText_ = std::move(r->configText);
    config_ = r->config;
    partition_ = std::move(r->partition);
    shard_ = std::move(r->shard);
    clocks_ = std::move(r->clocks);
    resumeStep_ = lastCheckpoint_ = report_.resumedFrom = r->round;
    report_.partition = partition_->describe();
    configured_ = initialized_ = restored_ = true;
    if (!opt_.quiet) {
      fmt::print("parameter server {} of {}: resumed from {} (step {})\n", id_, servers_, r->from,
                 r->round);
      std::fflush(stdout);
    }
  }

  // ---- failure

  void setBusy(int w, bool busy) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_[w] = busy;
  }

  void fail(int w, const std::string& what, bool serverFault = false) {
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

  comm::Group& world_;
  const int id_, servers_, workers_;
  const ServerOptions opt_;
  const bool backup_;
  TraceSink* const sink_;   // the world's (ps/trace_spans.h); null: not tracing
  const std::string name_;  // in messages
  std::unique_ptr<SealedSeries> series_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool configured_ = false, initialized_ = false, restored_ = false;
  std::unique_ptr<Partition> partition_;
  TrainingConfig config_;
  std::string configText_;
  std::unique_ptr<Shard> shard_;
  uint64_t resumeStep_ = 0;
  uint64_t lastCheckpoint_ = 0;
  std::vector<uint64_t> clocks_;
  std::vector<char> done_;
  std::vector<char> busy_;
  std::vector<std::shared_ptr<comm::Group>> pairs_;
  ShardAccess access_;
  std::string failure_;
  ServerReport report_;
};

}  // namespace

ServerReport serve(comm::Group& world, int server, int numServers, int numWorkers,
                   const ServerOptions& options) {
  if (options.replicas != 1 && options.replicas != 2) {
    SHOAL_THROW(InvalidArgument, "parameter-server replicas {}: 1 or 2", options.replicas);
  }
  if (options.replicas == 1) return Server(world, server, numServers, numWorkers, options).run();
  if (numServers < 2) {
    SHOAL_THROW(InvalidArgument,
                "parameter-server replicas 2 need at least 2 servers (the job has {})", numServers);
  }
  if (options.resume) {
    SHOAL_THROW(InvalidArgument,
                "parameter server {}: resuming from checkpoints with replicas 2 is not supported "
                "(resume with one copy of each shard: shoal run without --ps-replicas)",
                server);
  }
  // Note [Replicated shards]: this server's own shard, and the backup of the previous one.
  const int shard = (server + numServers - 1) % numServers;
  ServerReport backup;
  std::exception_ptr backupError;
  std::thread backupThread([&] {
    try {
      backup = Server(world, shard, numServers, numWorkers, options, /*backup=*/true).run();
    } catch (...) {
      backupError = std::current_exception();
    }
  });
  ServerReport primary;
  std::exception_ptr primaryError;
  try {
    primary = Server(world, server, numServers, numWorkers, options).run();
  } catch (...) {
    primaryError = std::current_exception();
  }
  // A failed primary's workers went on with its backup elsewhere: the backup hosted here still
  // serves its workers to the end.
  backupThread.join();
  if (primaryError) std::rethrow_exception(primaryError);
  if (backupError) std::rethrow_exception(backupError);
  primary.backups.push_back(std::move(backup));
  return primary;
}

}  // namespace shoal::ps
