// The requests a parameter server answers (ps/protocol.h), each in two halves under the
// server's lock: prepare() before its payload is received (checks, waits, where the payload
// goes), complete() once it is in (the update, the reply); compressed pushes decoded between
// (ps/server_state.h).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "ps/payload_codec.h"
#include "ps/replacement.h"
#include "ps/server_state.h"

namespace shoal::ps::detail {

namespace {

constexpr size_t kMaxHello = 16 << 20;

}  // namespace

void* Server::prepare(int w, const Request& rq, Scratch& sc) {
  const auto kind = static_cast<RequestKind>(rq.kind);
  std::unique_lock<std::mutex> lock(mu_);
  throwIfFailed();
  checkEncodings(rq);
  if ((rq.flags & kSoleCopy) != 0) sole_ = true;  // Note [Replacement servers]
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
          // Before any reply for the next step is decided (the streamed one just below).
          if (sync) maybePlanHandover(rq, t);
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

void Server::complete(int w, const Request& rq, Scratch& sc, Reply& rp, const void*& out,
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

void Server::hello(int w, const std::string& text, Reply& rp) {
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

void Server::push(std::unique_lock<std::mutex>& lock, int w, const Request& rq, Scratch& sc) {
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
  maybeHandOver();
  cv_.notify_all();
  maybeCheckpoint(lock);
}

void Server::traceApply(std::optional<TraceSpan>& span, int w, const Request& rq, const Target& t,
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

void Server::pull(std::unique_lock<std::mutex>& lock, int w, const Request& rq, uint64_t step,
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
  rp.flags = pullFlags(step);
  out = shard_->values() + t.offset;
  outBytes = t.count * sizeof(float);
}

void Server::unpack(const Request& rq, Scratch& sc, float* slot) {
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

}  // namespace shoal::ps::detail
